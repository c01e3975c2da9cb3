"""kernel_sandbox: stateful, safe Python sandboxes for LLM agents."""
