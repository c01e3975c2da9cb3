"""Record ``notebooks/example-analysis.ipynb``: a real agent session, scripted model.

The model is the local scripted OpenAI-compatible server the tests use, so this runs
anywhere without an API key; everything else is real: the openai client, the agent
loop, a sandbox on the default image, and the notebook recorder.  Re-run it with
``python notebooks/record_example.py`` from the repository root after changing the
agent or the recorder; ``make run`` replays the notebook it writes.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_sandbox.agent import Agent  # noqa: E402
from tests.openai_server import RecordedRequest, Reply, ScriptedOpenAIServer, call, text  # noqa: E402
from tests.openai_server import tool_calls as calls  # noqa: E402

TARGET = ROOT / "notebooks" / "example-analysis.ipynb"
#: The same data as a file, for the live demo (``kernel-sandbox demo`` with an API key).
DATA = ROOT / "notebooks" / "data" / "sales.csv"
PROMPT = (
    "Here is a month of daily sales for three regions. Save it as sales.csv, load it, "
    "describe it, plot sales per region over time and tell me which region grows fastest."
)


def sales_csv() -> str:
    rng = random.Random(7)
    rows = ["date,region,units,price"]
    for day in range(1, 31):
        for region, base, growth in (("north", 40, 0.4), ("south", 55, 1.3), ("west", 30, 0.9)):
            units = round(base + growth * day + rng.uniform(-4, 4))
            rows.append(f"2026-06-{day:02d},{region},{units},{rng.choice([9.5, 10.0, 10.5])}")
    return "\n".join(rows) + "\n"


PLOT = """\
import matplotlib.pyplot as plt
daily = df.pivot_table(index="date", columns="region", values="units")
ax = daily.plot(figsize=(7, 3.5), marker=".", title="Units sold per day")
ax.set_ylabel("units")
plt.tight_layout()
plt.show()
"""

GROWTH = """\
import numpy as np
slopes = {
    region: np.polyfit(group["date"].dt.day, group["units"], 1)[0]
    for region, group in df.groupby("region")
}
growth = pd.Series(slopes, name="units per day").sort_values(ascending=False).round(2)
growth
"""


def answer(request: RecordedRequest) -> Reply:
    """The final answer, written from what the last tool result actually said."""
    last = json.loads(request.tool_messages[-1]["content"])
    fastest = last["output"].split()[0]
    return text(
        "I saved the data as `sales.csv` (90 rows: 30 days x 3 regions), described it and "
        "plotted units per day for each region.\n\nTrend of units per day (linear fit):\n\n"
        f"```\n{last['output']}\n```\n\n**{fastest}** grows fastest."
    )


def main() -> None:
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(sales_csv())
    script = [
        calls(
            call(
                "file_operation",
                {"operation": "write", "file_path": "sales.csv", "content": sales_csv()},
            )
        ),
        calls(
            call(
                "python_executor",
                {
                    "code": "import pandas as pd\n"
                    "df = pd.read_csv('sales.csv', parse_dates=['date'])\n"
                    "df['revenue'] = df.units * df.price\ndf.head()"
                },
            )
        ),
        calls(
            call("python_executor", {"code": "df.describe()"}),
            call("shell_executor", {"command": "wc -l sales.csv && head -n 3 sales.csv"}),
        ),
        calls(call("python_executor", {"code": PLOT})),
        calls(call("python_executor", {"code": GROWTH})),
        answer,
    ]
    with ScriptedOpenAIServer(script) as server:
        agent = Agent(model="scripted-analyst", base_url=server.base_url, api_key="local")
        result = agent.run(PROMPT, notebook_path=TARGET)
    print(result.status, "->", TARGET)
    print(result.answer)


if __name__ == "__main__":
    main()
