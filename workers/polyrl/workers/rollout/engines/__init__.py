"""Generation engines behind one interface (`base.Engine`), chosen by a policy's `rollout.engine`.

`make_engine(kind, model, **options)` is the only place that knows which module implements which
kind, so adding an engine is one new module and one line in `_ENGINES`. Engine modules are
imported on demand: asking for `torch` never imports vLLM, and importing this package imports
neither transformers nor vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

from polyrl.workers.rollout.engines import base

# kind (as in `polyrl.api.resources.Engine`) -> (module, class)
_ENGINES = {
    "torch": ("polyrl.workers.rollout.engines.torch_engine", "TorchEngine"),
    "vllm": ("polyrl.workers.rollout.engines.vllm_engine", "VllmEngine"),
}

KINDS = tuple(_ENGINES)


def make_engine(kind: str, model: Any, **options: Any) -> base.Engine:
    """An engine of `kind` over `model`; `options` go to its constructor (device, batch size...).

    Raises ValueError for a kind nobody implements, and `base.EngineUnavailable` when the
    engine's library is missing here (vLLM on a machine without it).
    """
    try:
        module_name, class_name = _ENGINES[str(kind)]
    except KeyError:
        raise ValueError(f"unknown engine {kind!r}; known engines: {', '.join(KINDS)}") from None
    engine_class = getattr(importlib.import_module(module_name), class_name)
    return cast(base.Engine, engine_class(model, **options))
