"""E2B's display conventions, in a sandbox's IPython kernel (sandboxes made over /e2b).

E2B's code interpreter shows more than Jupyter does, and its SDK reads it: a pandas
DataFrame comes with its columns (``Result.data``), a matplotlib figure with the chart
drawn in it (``Result.chart``, by the ``e2b_charts`` package where the image has it),
lists and dicts as ``application/json``, and a PIL image's ``show()`` or
``save(path)`` displays the image.  The launcher runs this
source in the kernel's shell at every start when ``KERNEL_SANDBOX_STARTUP`` holds it.
Nothing here imports pandas, matplotlib or PIL before a cell does.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from IPython.core.formatters import BaseFormatter, JSONFormatter
from IPython.core.getipython import get_ipython
from traitlets import ObjectName, Unicode

#: E2B's template names them ``e2b/data`` and ``e2b/chart``; a notebook holds JSON
#: values only under JSON media types, so here they are these (the server's /execute
#: answers them as E2B's ``data`` and ``chart``).
DATA = "application/vnd.e2b.data+json"
CHART = "application/vnd.e2b.chart+json"


class DataFrameColumns(BaseFormatter):
    """:data:`DATA`: a DataFrame as ``{column: [values]}`` (timestamps in ISO 8601)."""

    format_type = Unicode(DATA)
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj: Any) -> Any:
        pandas = sys.modules.get("pandas")
        if pandas is None or not isinstance(obj, pandas.DataFrame):
            return super().__call__(obj)
        columns = obj.to_dict(orient="list")
        stamp = pandas.Timestamp
        return {
            str(name): [v.isoformat() if isinstance(v, stamp) else v for v in values]
            for name, values in columns.items()
        }


class FigureChart(BaseFormatter):
    """:data:`CHART`: what a matplotlib figure draws, as ``e2b_charts`` describes it."""

    format_type = Unicode(CHART)
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict, str)

    def __call__(self, obj: Any) -> Any:
        if "matplotlib" not in sys.modules:
            return super().__call__(obj)
        from matplotlib.figure import Figure

        if not isinstance(obj, Figure):
            return super().__call__(obj)
        try:
            from e2b_charts import chart_figure_to_dict
        except ImportError:  # the image has no chart extractor: a PNG only
            return None
        try:
            return chart_figure_to_dict(obj)
        except Exception:  # a chart it cannot read is shown as its image only
            return None


class PlainJSON(JSONFormatter):
    """``application/json`` for a list or dict value (numpy values as numbers)."""

    def __call__(self, obj: Any) -> Any:
        if isinstance(obj, (list, dict)):
            try:
                import orjson
            except ImportError:
                return super().__call__(obj)
            options = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
            try:
                return orjson.loads(orjson.dumps(obj, option=options)), {"expanded": True}
            except TypeError:
                pass
        return super().__call__(obj)


def _displaying(image_module: Any) -> None:
    """PIL's ``Image.show()`` and ``Image.save(path)`` display the image (no viewer)."""
    from IPython.display import display

    saving = image_module.Image.save

    def save(image: Any, fp: Any, format: Any = None, **options: Any) -> Any:
        if isinstance(fp, str):
            display(image)  # type: ignore[no-untyped-call]
        return saving(image, fp, format, **options)

    def show(image: Any, title: Any = None) -> None:
        display(image)  # type: ignore[no-untyped-call]

    image_module.Image.save = save
    image_module.Image.show = show


class _WhenPILIsImported:
    """A finder that lets ``PIL.Image`` load as usual, then makes it display."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "PIL.Image":
            return None
        sys.meta_path.remove(self)  # once: the real finders find it
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        load = loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            _displaying(module)

        loader.exec_module = exec_module
        return spec


shell = get_ipython()  # type: ignore[no-untyped-call]
formatters = shell.display_formatter.formatters
formatters[DATA] = DataFrameColumns(parent=shell.display_formatter)
formatters[CHART] = FigureChart(parent=shell.display_formatter)
formatters["application/json"] = PlainJSON(parent=shell.display_formatter)
if "PIL.Image" in sys.modules:
    _displaying(sys.modules["PIL.Image"])
else:  # the cell imports it, and uses it in the same cell
    sys.meta_path.insert(0, _WhenPILIsImported())
