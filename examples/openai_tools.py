"""An LLM agent with sandbox tools over OpenAI function calling (ms-enclave's guide).

This is ms-enclave's "LLM Agent Integration (OpenAI Tools)" program with only the
imports changed, plus the endpoint, model and image read from the environment so it
runs against any OpenAI-compatible server:

    OPENAI_BASE_URL   endpoint (default: the OpenAI API)
    OPENAI_API_KEY    key for it
    OPENAI_MODEL      model name (default: gpt-4o-mini)
    SANDBOX_IMAGE     any image with Python (default: python:3.11-slim)
"""

import asyncio
import json
import os

from openai import OpenAI

from kernel_sandbox import DockerSandboxConfig, SandboxManagerFactory, SandboxType

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")


async def run_agent():
    client = OpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ["OPENAI_API_KEY"],
    )
    os.makedirs("output", exist_ok=True)

    async with SandboxManagerFactory.create_manager() as manager:
        config = DockerSandboxConfig(
            image=os.environ.get("SANDBOX_IMAGE", "python:3.11-slim"),
            tools_config={
                "python_executor": {},
                "shell_executor": {},
                "file_operation": {},
            },
            volumes={os.path.abspath("./output"): {"bind": "/sandbox/data", "mode": "rw"}},
        )
        sandbox_id = await manager.create_sandbox(SandboxType.DOCKER, config)

        # 1) Fetch tool schemas
        tools = await manager.get_sandbox_tools(sandbox_id)

        messages = [
            {
                "role": "system",
                "content": "You can run Python and shell commands inside a managed sandbox "
                "via the provided tools. Always use tools to compute and summarize results.",
            },
            {
                "role": "user",
                "content": "1) Use Python to compute 123456 * 654321.\n"
                "2) Use shell to list /sandbox/data.\n"
                "Then summarize.",
            },
        ]

        # 2) First call: model decides which tools to invoke
        completion = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=list(tools.values()),
            tool_choice="auto",
        )
        msg = completion.choices[0].message
        messages.append(msg.model_dump())

        # 3) Execute tool_calls one by one
        for call in msg.tool_calls or []:
            args = json.loads(call.function.arguments or "{}")
            result = await manager.execute_tool(sandbox_id, call.function.name, args)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.function.name,
                    "content": result.model_dump_json(),
                }
            )

        # 4) Let the model produce the final answer based on tool results
        final = client.chat.completions.create(model=MODEL, messages=messages)
        print(final.choices[0].message.content)


asyncio.run(run_agent())
