#!/bin/sh
# Regenerates kernel_sandbox/server/e2b/envd/{process,filesystem} from E2B's envd .proto
# files (copied unchanged from e2b-dev/E2B spec/envd into envd/spec), with the same
# generators E2B's Python SDK uses: protoc-gen-py (protobuf-py messages) and
# protoc-gen-connectrpc (Connect services), run by grpcio-tools' protoc.
#   pip install grpcio-tools 'protoc-gen-py==0.6.*' 'protoc-gen-connectrpc==0.12.*'
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
envd="$root/kernel_sandbox/server/e2b/envd"
py=${PYTHON:-python3}
includes=$("$py" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
for service in process filesystem; do
    "$py" -m grpc_tools.protoc -I "$envd/spec" -I "$includes" \
        --plugin=protoc-gen-py="$(command -v protoc-gen-py)" \
        --plugin=protoc-gen-connectrpc="$(command -v protoc-gen-connectrpc)" \
        --py_out="$envd" --connectrpc_out="$envd" "$envd/spec/$service/$service.proto"
    touch "$envd/$service/__init__.py"
done
