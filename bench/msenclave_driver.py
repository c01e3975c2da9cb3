"""Drive ms-enclave's Docker sandbox ``python_executor``; run with ms-enclave's own Python.

Not part of kernel_sandbox: ``bench/run.py`` runs this file with the interpreter of a
bench-only virtualenv holding ``ms-enclave[docker]==0.0.8`` and reads one JSON line
from stdout.  Same limits as our sandboxes: no network, 1 GB, one CPU.

    python msenclave_driver.py IMAGE STARTS CALLS
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time


async def main(image: str, starts: int, calls: int) -> dict[str, object]:
    from ms_enclave.sandbox.boxes import SandboxFactory
    from ms_enclave.sandbox.model import DockerSandboxConfig, SandboxType

    def config() -> DockerSandboxConfig:
        return DockerSandboxConfig(
            image=image,
            tools_config={"python_executor": {}},
            network_enabled=False,
            memory_limit="1g",
            cpu_limit=1.0,
        )

    cold: list[float] = []
    latency: list[float] = []
    outputs = set()
    for i in range(starts):
        t0 = time.perf_counter()
        sandbox = SandboxFactory.create_sandbox(SandboxType.DOCKER, config())
        try:
            await sandbox.start()
            result = await sandbox.execute_tool("python_executor", {"code": "print(1+1)"})
            cold.append(time.perf_counter() - t0)
            outputs.add(result.output)
            if i == starts - 1:
                for _ in range(calls):
                    t = time.perf_counter()
                    result = await sandbox.execute_tool("python_executor", {"code": "print(1+1)"})
                    latency.append(time.perf_counter() - t)
                    outputs.add(result.output)
        finally:
            await sandbox.stop()
            await sandbox.cleanup()
    return {"cold": cold, "latency": latency, "outputs": sorted(outputs)}


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)  # ms-enclave logs every tool output at INFO
    image, starts, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(asyncio.run(main(image, starts, calls))))
