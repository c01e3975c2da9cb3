"""Every cap in ``kernel_sandbox/limits.py`` is paired with the test that floods it.

``PROOFS`` names, for each cap, the tests (``path::function``) that prove it holds; the
test below fails when a cap of limits.py has no entry (a new cap needs its proof, or a
reason in ``UNPROVEN``), when an entry names a cap limits.py no longer holds, and when a
named test does not exist.  ``UNPROVEN`` is the list, kept here on purpose, of caps whose
flood test is still to be written, each with the reason: it may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kernel_sandbox.limits as limits

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_BYTES = "tests/integration/test_hostile_host_bytes.py"
HOSTILE_OUTPUT = "tests/integration/test_hostile_output.py"
HOSTILE_HTTP = "tests/integration/test_hostile_server_http.py"
HOSTILE_IMAGES = "tests/integration/test_hostile_server_images.py"
HOSTILE_PATHS = "tests/integration/test_hostile_host_paths.py"
E2B_CAPS = (
    "tests/integration/test_e2b.py::"
    "test_one_sandboxs_lifetime_listings_watch_events_uploads_commands_and_watchers_are_capped"
)

AGENTS_PTY = (
    "tests/integration/test_integrations_openai_agents.py::"
    "test_pty_processes_end_with_their_status_and_are_bounded"
)
STOPPED_HELPER = (
    "tests/unit/test_transfer.py::"
    "test_a_file_helper_the_sandbox_stops_holds_the_host_only_to_its_deadline"
)

PROOFS: dict[str, list[str]] = {
    "ATTACH_CELL_OUTPUT_BYTES": [
        "tests/unit/test_attach_recording.py::test_a_cell_that_prints_megabytes_is_recorded_within_the_cap"
    ],
    "CHECKPOINT_FILES": [
        "tests/unit/test_snapshot_exact.py::"
        "test_a_checkpoint_of_more_files_than_the_cap_is_refused_and_nothing_stored",
        "tests/unit/test_flattar.py::test_a_name_twice_too_many_files_and_a_cut_stream_are_refused",
    ],
    "DRAIN_BYTES": [
        "tests/unit/test_server_unit.py::test_a_refused_body_is_drained_only_up_to_the_drain_cap"
    ],
    "E2B_RECORD_BYTES": [
        "tests/unit/test_e2b_shared.py::test_a_record_over_the_cap_is_refused_and_a_file_over_it_ignored"
    ],
    "E2B_ENTRY_METADATA_BYTES": [
        "tests/integration/test_e2b_envd.py::"
        "test_file_metadata_is_kept_as_xattrs_and_watch_events_carry_entries"
    ],
    "E2B_LIST_LIMIT": [E2B_CAPS],
    "E2B_MAX_DEPTH": [E2B_CAPS],
    "E2B_MAX_PROCESSES": [E2B_CAPS],
    "E2B_MAX_WATCHERS": [E2B_CAPS],
    "E2B_MAX_TIMEOUT": [E2B_CAPS],
    "E2B_MAX_UPLOAD_FILES": [E2B_CAPS],
    "E2B_WATCHER_EVENTS": [E2B_CAPS],
    "E2B_WATCH_SCAN_ENTRIES": [
        "tests/integration/test_e2b_envd.py::"
        "test_recursive_watch_tells_nested_uploads_and_what_a_new_directory_already_holds"
    ],
    "E2B_METRICS_SAMPLES": [
        "tests/unit/test_e2b_metrics.py::test_a_sandbox_keeps_its_newest_metrics_samples_up_to_the_cap"
    ],
    "EGRESS_CA_BYTES": [
        "tests/unit/test_egress_wiring.py::test_a_bad_ca_bundle_is_a_config_error_and_leaves_nothing"
    ],
    "EGRESS_PENDING_REFUSALS": [
        "tests/unit/test_egress_wiring.py::test_refusals_waiting_to_be_reported_are_capped"
    ],
    "EVENT_DETAIL_CHARS": [
        "tests/unit/test_tools.py::test_an_events_detail_and_content_are_bounded"
    ],
    "LIVE_CALL_OUTPUT_BYTES": [
        "tests/unit/test_live_call.py::test_a_flood_of_outputs_is_shown_up_to_the_cap"
    ],
    "MAX_422_ERRORS": [
        "tests/unit/test_server_edge.py::test_a_422_lists_a_bounded_number_of_errors_each_cut_short"
    ],
    "MAX_422_TEXT": [
        "tests/unit/test_server_edge.py::test_a_422_lists_a_bounded_number_of_errors_each_cut_short"
    ],
    "MAX_EVENT_BYTES": ["tests/unit/test_remote_events.py::test_an_event_over_the_cap_is_an_error"],
    "MAX_SNAPSHOT_REPORT_BYTES": [
        "tests/unit/test_snapshots.py::test_a_lying_report_is_cut_to_bounded_text_or_refused"
    ],
    "MCP_MAX_TEXT_CHARS": [
        "tests/unit/test_mcp_results.py::test_a_flood_of_output_is_cut_to_its_ends_in_every_result"
    ],
    "MIN_MEMORY_BYTES": ["tests/unit/test_config.py::test_invalid_settings_name_the_setting"],
    "NOTEBOOK_IMAGE_BYTES": [
        "tests/unit/test_notebook_budget.py::test_an_image_over_the_size_cap_keeps_its_text"
    ],
    "POOL_PING_SECONDS": [
        "tests/unit/test_pool.py::test_a_member_that_does_not_answer_is_discarded_at_the_ping_limit"
    ],
    "PTY_MAX_PROCESSES": [AGENTS_PTY],
    "PTY_UNREAD_BYTES": [AGENTS_PTY],
    "PTY_UPDATE_BYTES": [AGENTS_PTY],
    "SESSION_TTL": ["tests/unit/test_server_edge.py::test_a_session_ends_after_its_time_to_live"],
    "SMOLAGENTS_IMAGE_PIXELS": [
        "tests/unit/test_smolagents_images.py::test_an_image_past_the_pixel_cap_is_not_decoded"
    ],
    "SNAPSHOT_CONNECTION_BYTES": [
        "tests/unit/test_snapshot_exact.py::test_a_kernel_connection_is_read_only_up_to_the_cap"
    ],
    "SNAPSHOT_DEADLINE": [
        "tests/unit/test_snapshots.py::test_a_kernel_that_stalls_its_snapshot_is_ended_at_the_deadline"
    ],
    "SNAPSHOT_RATE": [
        "tests/unit/test_snapshots.py::test_a_kernel_that_stalls_its_snapshot_is_ended_at_the_deadline"
    ],
    "SNAPSHOT_REPORT_TEXT_CHARS": [
        "tests/unit/test_snapshots.py::test_a_lying_report_is_cut_to_bounded_text_or_refused"
    ],
    "STATUS_LINE_BYTES": [
        "tests/unit/test_statedir.py::test_an_endless_unfinished_line_is_dropped_not_kept"
    ],
    "STREAM_EVENT_CONTENT": [
        "tests/unit/test_tools.py::test_an_events_detail_and_content_are_bounded"
    ],
    "PROCESS_THREADS": [
        "tests/unit/test_threads.py::test_process_threads_take_no_executor_thread_and_are_capped_per_owner"
    ],
    "THREAD_WORKERS": [
        "tests/unit/test_threads.py::test_an_owners_calls_run_on_its_own_threads",
        "tests/integration/test_hostile_server_tenants.py::test_one_keys_long_calls_do_not_hold_another_keys_calls",
    ],
    "CWD_COPY_MAX_BYTES": [
        "tests/unit/test_jupyter_client_request.py::test_folder_copy_refuses_a_folder_over_its_bounds"
    ],
    "CWD_COPY_MAX_FILES": [
        "tests/unit/test_jupyter_client_request.py::test_folder_copy_refuses_a_folder_over_its_bounds"
    ],
    "HOST_TASKS_CEILING": [
        "tests/unit/test_runtimes.py::test_the_host_backstop_stops_at_a_ceiling"
    ],
    "K8S_EXEC_STATUS_BYTES": [
        "tests/kubernetes/test_host.py::"
        "test_a_long_commands_status_is_capped_and_still_tells_its_exit_code"
    ],
    "K8S_STATUS_READ_BYTES": [
        "tests/kubernetes/test_host.py::test_a_status_file_the_sandbox_floods_is_read_within_its_cap"
    ],
    "KERNEL_ARG_MAX_CHARS": [
        "tests/unit/test_jupyter_client_request.py::test_a_flood_of_arguments_is_cut_at_the_bound"
    ],
    "KILL_LIMIT": [
        "tests/unit/test_supervisor.py::test_a_kernel_end_never_reported_is_a_kernel_error"
    ],
    "LIST_ENTRY_BYTES": [f"{HOSTILE_PATHS}::test_listing_is_structured_and_capped"],
    "LIST_LIMIT": [f"{HOSTILE_PATHS}::test_listing_is_structured_and_capped"],
    "LIVE_POLL_SECONDS": [
        "tests/unit/test_live_call.py::test_a_long_poll_of_a_quiet_session_is_held_at_most_its_limit"
    ],
    "LIVE_PAGE_TEXT_CHARS": [
        "tests/unit/test_live_render.py::test_images_only_as_data_urls_and_long_text_cut"
    ],
    "MAX_CODE_CHARS": ["tests/integration/test_bad_input.py::test_huge_strings"],
    "MAX_IMAGE_PIXELS": [
        "tests/unit/test_notebook_media.py::test_an_image_too_large_to_decode_is_compared_by_its_bytes"
    ],
    "MCP_REFUSED_HEAD_BYTES": [
        "tests/unit/test_mcp_stdio_bounds.py::test_a_64_mib_line_and_a_costly_one_are_refused_with_an_error"
    ],
    "MIN_DISK_BYTES": ["tests/unit/test_config.py::test_invalid_settings_name_the_setting"],
    "NOTEBOOK_EMBEDDED_FILE_BYTES": [
        "tests/integration/test_server_native.py::test_files_stream_both_ways_and_a_refused_upload_changes_nothing"
    ],
    "NOTEBOOK_LANGUAGE_INFO_CHARS": [
        "tests/unit/test_notebook_languages.py::test_a_kernels_words_about_itself_are_bounded_in_the_notebook"
    ],
    "STATUS_FIFO_READ_BYTES": [
        "tests/unit/test_statedir.py::test_a_full_fifo_is_drained_and_holds_at_most_a_pipe",
        f"{HOSTILE_PATHS}::test_status_links_and_fifos_cost_the_host_nothing",
    ],
    "STATUS_FILE_READ_BYTES": [
        f"{HOSTILE_PATHS}::test_status_links_and_fifos_cost_the_host_nothing"
    ],
    "STATUS_FILE_READ_SECONDS": [
        f"{HOSTILE_PATHS}::test_status_links_and_fifos_cost_the_host_nothing"
    ],
    "DOWNLOAD_WHOLE_BYTES": [
        "tests/integration/test_hostile_server_tenants.py::test_special_file_downloads_are_bounded_without_a_traceback"
    ],
    "ARCHIVE_MAX_MEMBERS": [
        "tests/unit/test_server_archives.py::test_many_empty_members_count_toward_the_cap_and_the_member_limit"
    ],
    "ARCHIVE_MEMBER_COST_BYTES": [
        "tests/unit/test_server_archives.py::test_many_empty_members_count_toward_the_cap_and_the_member_limit"
    ],
    "DEFAULT_MAX_FILE_BYTES": [f"{HOSTILE_OUTPUT}::test_a_2_gb_file_is_refused_unread"],
    "DEFAULT_MAX_OUTPUT_BYTES": [
        f"{HOSTILE_OUTPUT}::test_a_gigabyte_of_stdout_in_1_mb_prints",
        f"{HOSTILE_OUTPUT}::test_one_write_of_300_mb",
        f"{HOSTILE_OUTPUT}::test_a_gigabyte_of_shell_output_on_both_streams",
    ],
    "ENGINE_LOG_TAIL_BYTES": [f"{HOSTILE_BYTES}::test_engine_log_is_capped"],
    "GUARD_CHUNK_BYTES": [
        "tests/unit/test_guard.py::test_unread_messages_hold_the_kernel_at_the_bound"
    ],
    "GUARD_STALL_LIMIT": [
        "tests/unit/test_guard.py::test_an_unfinished_message_over_the_bound_is_cut"
    ],
    "HEADER_TIMEOUT": [
        f"{HOSTILE_HTTP}::test_half_sent_heads_are_cut_and_keyed_requests_keep_working"
    ],
    "HELD_MESSAGES": [
        f"{HOSTILE_BYTES}::test_one_message_of_many_frames",
        f"{HOSTILE_BYTES}::test_many_messages_of_many_frames",
    ],
    "IMAGE_QUEUE_PER_KEY": [
        f"{HOSTILE_IMAGES}::test_one_keys_slow_images_do_not_hold_another_keys_create"
    ],
    "IMAGE_STEP_CHATTER_BYTES": [
        f"{HOSTILE_IMAGES}::test_a_probe_that_prints_100_mib_costs_the_server_nothing"
    ],
    "IMAGE_STEP_MEMORY_BYTES": [
        f"{HOSTILE_IMAGES}::test_the_images_code_runs_only_under_sandbox_limits"
    ],
    "IMAGE_STEP_OUTPUT_BYTES": [
        f"{HOSTILE_IMAGES}::test_a_probe_that_prints_100_mib_costs_the_server_nothing"
    ],
    "IMAGE_STEP_PIDS": [f"{HOSTILE_IMAGES}::test_the_images_code_runs_only_under_sandbox_limits"],
    "IMAGE_DERIVE_SECONDS": [
        f"{HOSTILE_IMAGES}::test_a_venv_build_past_its_deadline_is_stopped_there"
    ],
    "IMAGE_PROBE_SECONDS": [f"{HOSTILE_IMAGES}::test_a_probe_past_its_deadline_is_stopped_there"],
    "IMAGE_VENV_BYTES": [f"{HOSTILE_IMAGES}::test_a_venv_past_its_bytes_is_refused_at_the_cap"],
    "IMAGE_STEP_CPUS": [f"{HOSTILE_IMAGES}::test_the_images_code_runs_only_under_sandbox_limits"],
    "IMAGE_STEP_TMP_BYTES": [
        f"{HOSTILE_IMAGES}::test_the_images_code_runs_only_under_sandbox_limits"
    ],
    "IMAGE_ACCOUNT_FILE_BYTES": [
        f"{HOSTILE_IMAGES}::test_an_account_file_past_its_cap_is_refused_not_cut"
    ],
    "MAX_KERNELSPECS_BYTES": [
        f"{HOSTILE_IMAGES}::test_a_flood_of_kernelspecs_is_refused_at_the_listings_cap"
    ],
    "KERNEL_ARGS_MAX": [
        "tests/unit/test_jupyter_client_request.py::test_a_flood_of_arguments_is_cut_at_the_bound"
    ],
    "KERNEL_ENV_MAX_BYTES": [
        "tests/unit/test_jupyter_client_request.py::test_a_flood_of_variables_is_cut_at_the_bound"
    ],
    "MALFORMED_WARNING_SECONDS": [
        "tests/unit/test_outputs.py::test_malformed_outputs_become_a_note_and_one_rate_limited_warning"
    ],
    "MAX_BODY_BYTES_PER_KEY": [
        f"{HOSTILE_HTTP}::test_json_floods_are_refused_unparsed_and_nothing_is_echoed"
    ],
    "MAX_CALLS_PER_KEY": [
        "tests/unit/test_server_edge.py::test_one_key_gets_429_past_its_calls_in_flight_and_others_do_not"
    ],
    "MAX_CONNECTIONS": [
        f"{HOSTILE_HTTP}::test_half_sent_heads_are_cut_and_keyed_requests_keep_working"
    ],
    "MAX_CONTEXTS": ["tests/unit/test_contexts.py::test_contexts_are_bounded"],
    "MAX_HEAD_BYTES": [f"{HOSTILE_HTTP}::test_a_huge_head_gets_431"],
    "MAX_JSON_DEPTH": [
        "tests/unit/test_server_edge.py::test_json_shape_is_judged_on_the_bytes_before_parsing"
    ],
    "MAX_JSON_VALUES": [
        "tests/unit/test_server_edge.py::test_a_flood_of_values_is_refused_unparsed_and_a_422_never_echoes"
    ],
    "MAX_MCP_LINE_BYTES": [
        "tests/unit/test_mcp_stdio_bounds.py::test_a_64_mib_line_and_a_costly_one_are_refused_with_an_error"
    ],
    "MAX_MCP_SESSIONS_PER_KEY": [
        f"{HOSTILE_HTTP}::test_mcp_sessions_answer_only_their_key_and_are_capped_per_key"
    ],
    "MAX_REQUEST_BYTES": [
        "tests/unit/test_server_unit.py::test_oversized_bodies_get_413_before_any_route_runs"
    ],
    "MAX_SIZE_BYTES": [
        "tests/unit/test_server_limits.py::test_sizes_parse_to_whole_bytes_within_bounds"
    ],
    "MAX_SNAPSHOT_BYTES": [
        "tests/unit/test_snapshots.py::test_caps_hold_against_a_kernel_that_lies"
    ],
    "MAX_SNAPSHOT_FILES": [
        "tests/unit/test_snapshots.py::test_caps_hold_against_a_kernel_that_lies"
    ],
    "MAX_SOCKETS_CAP": [
        "tests/unit/test_zmq_context.py::test_max_sockets_follows_the_open_file_limit"
    ],
    "MAX_STREAMS_PER_KEY": [
        "tests/unit/test_server_edge.py::test_one_key_gets_429_past_its_open_streams"
    ],
    "MESSAGE_OVERHEAD": [f"{HOSTILE_BYTES}::test_one_message_of_many_frames"],
    "NOTEBOOK_CALL_IMAGES": [
        "tests/unit/test_notebook_budget.py::test_images_past_the_count_keep_their_text"
    ],
    "NOTEBOOK_CALL_OUTPUT_BYTES": [
        "tests/unit/test_notebook_budget.py::test_one_call_keeps_its_ends_within_the_per_call_cap"
    ],
    "NOTEBOOK_TURN_WAIT_SECONDS": [
        "tests/unit/test_notebook_shared.py::"
        "test_a_writer_gives_up_on_a_turn_kept_where_no_poke_is_heard"
    ],
    "NOTEBOOK_MAX_OUTPUT_BYTES": [
        "tests/unit/test_notebook_budget.py::test_a_long_session_stops_recording_outputs_at_the_notebooks_cap"
    ],
    "RECEIVE_QUEUE": [
        f"{HOSTILE_BYTES}::test_input_requests_do_not_pile_up",
        f"{HOSTILE_BYTES}::test_unread_iopub_messages_do_not_pile_up",
    ],
    "PSEUDO_FILE_BYTES": [
        "tests/integration/test_hostile_server_tenants.py::test_special_file_downloads_are_bounded_without_a_traceback"
    ],
    "REPLAY_PROBE_BYTES": [
        "tests/unit/test_notebook_replay.py::test_a_kernel_probe_answer_past_its_bytes_is_no_answer"
    ],
    "REPLY_AFTER_IDLE": [f"{HOSTILE_BYTES}::test_forged_idle_does_not_end_the_call"],
    "REPLY_TEXT_CHARS": [f"{HOSTILE_BYTES}::test_one_huge_exception"],
    "E2B_SUBSCRIBER_QUEUE": [
        "tests/unit/test_e2b_process.py::"
        "test_a_stalled_subscriber_holds_the_command_not_the_servers_memory"
    ],
    "E2B_CONTROL_DEADLINE": [
        "tests/unit/test_e2b_process.py::"
        "test_a_control_write_the_sandbox_blocks_holds_the_server_only_to_its_deadline"
    ],
    "E2B_MAX_FRAME": [
        "tests/unit/test_e2b_process.py::"
        "test_a_frame_past_its_cap_ends_the_command_and_is_never_held"
    ],
    "E2B_ENTRY_BYTES": [
        "tests/unit/test_e2b_filesystem.py::"
        "test_an_entry_past_its_bytes_is_resource_exhausted_and_the_largest_real_one_fits"
    ],
    "E2B_FILE_OP_DEADLINE": [
        "tests/unit/test_e2b_filesystem.py::"
        "test_a_helper_the_sandbox_stalls_holds_the_host_only_to_its_deadline"
    ],
    "FILE_OP_DEADLINE": [STOPPED_HELPER],
    "FILE_OP_RATE": [STOPPED_HELPER],
    "FILE_STREAM_QUEUE": [
        "tests/unit/test_transfer.py::test_a_stalled_reader_holds_at_most_the_stream_queue_on_the_host"
    ],
    "STREAM_QUEUE_BYTES": [
        f"{HOSTILE_HTTP}::test_stalled_event_streams_cost_their_own_calls_not_server_memory"
    ],
}

#: Caps with no flood test yet, each with why (caps26, 2026-12-07): may only shrink.
UNPROVEN: dict[str, str] = {
    "DRAIN_LIMIT": (
        "a chatty kernel that ignores SIGINT still goes silent for a liveness poll here and"
        " ends stuck by silence first; a test could not fail (caps26)"
    ),
    "ARCHIVE_CHUNK_BYTES": (
        "a read size (memory per member written), not a count a flood passes; no test measures it"
    ),
    "CWD_COPY_DEADLINE": (
        "our own tar unpacks the copy before any tenant code runs; only a hostile image's tar"
        " could stall it"
    ),
    "IMAGE_RESOLVE_WORKERS": (
        "a thread pool's size; IMAGE_QUEUE_PER_KEY's test floods the queue in front of it"
    ),
    "K8S_EXEC_CONNECT_SECONDS": (
        "a connect timeout to the operator's API server (one that accepts and never answers),"
        " nothing a tenant reaches; test_api_server_unreachable covers a refused one"
    ),
    "KEEP_ALIVE_TIMEOUT": (
        "uvicorn's own idle timeout, whose default is the same 5 s: a test could not tell the"
        " setting from its absence; HEADER_TIMEOUT's flood covers the connections it bounds"
    ),
    "NOTEBOOK_POINTER_CHARS": "a host file this machine's recorders write, not a sandbox's",
}


def caps() -> set[str]:
    """The caps limits.py holds: its public upper-case names bound to numbers (or maps)."""
    return {
        name
        for name, value in vars(limits).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, int | float | dict)
    }


def test_every_cap_has_its_proof_or_a_stated_gap() -> None:
    held = caps()
    missing = held - PROOFS.keys() - UNPROVEN.keys()
    assert not missing, f"caps in limits.py with no proving test in PROOFS: {sorted(missing)}"
    assert not (PROOFS.keys() | UNPROVEN.keys()) - held, "entries for caps no longer in limits"
    assert not PROOFS.keys() & UNPROVEN.keys(), "a cap with a proof is no longer unproven"
    assert all(reason.strip() for reason in UNPROVEN.values()), "every gap says why"


def test_every_named_proof_exists() -> None:
    defined: dict[str, set[str]] = {}
    for cap, proofs in PROOFS.items():
        assert proofs, cap
        for proof in proofs:
            path, _, name = proof.partition("::")
            if path not in defined:
                tree = ast.parse((ROOT / path).read_text())
                defined[path] = {
                    node.name
                    for node in tree.body
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                }
            assert name in defined[path], f"{cap}: {proof} does not exist"


def test_the_in_sandbox_mirrors_match_their_programs() -> None:
    package = ROOT / "kernel_sandbox"
    for cap in limits.IN_SANDBOX:
        assert f"``{cap.name}``" in (limits.__doc__ or ""), f"{cap} not listed in the docstring"
        tree = ast.parse((package / cap.program).read_text())
        values = {
            target.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        assert cap.name in values, f"{cap.program} holds no {cap.name}"
        # the program's own constant expression (e.g. ``1 << 20``), nothing else in scope
        held = eval(compile(ast.Expression(values[cap.name]), cap.program, "eval"), {})
        assert held == cap.value, f"{cap.program}: {cap.name} = {held}, limits mirrors {cap.value}"
