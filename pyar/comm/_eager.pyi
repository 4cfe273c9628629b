# Types of the compiled per-call path (pyar/comm/_eager.pyx): the base class
# whose replay methods NodeCommunicator calls first on every collective.
from typing import Any, Optional, Sequence, Tuple

class Plan:
    def __init__(self, sequence: Any, descriptions: Sequence[Tuple[str, str]],
                 fresh: Any = None, out_dtype: Any = None, returns: Tuple[int, ...] = ()) -> None: ...

class PlanCache:
    _closed: bool
    _failure: Optional[BaseException]
    debug: bool
    world: int
    _calls: int
    _call_log: Any
    _error_ptr: int
    _sequence_type: Any
    def _forget_plans(self) -> None: ...
    def _replayed_call(self, call: int) -> Optional[str]: ...
    def _checked_call(self, call: int) -> None: ...
    def _replay_allreduce(self, x: Any, out: Any, algo: Any, stream: Any) -> Any: ...
    def _replay_shards(self, kind: str, x: Any, out: Any, rest: Tuple[Any, ...],
                       stream: Any) -> Any: ...
    def _replay_rmsnorm(self, arrays: Tuple[Any, ...], scalars: Tuple[Any, ...],
                        stream: Any) -> Optional[Tuple[Any, ...]]: ...
    def _remember(self, kind: str, arrays: Tuple[Any, ...], rest: Tuple[Any, ...], stream: Any,
                  steps: list[Any], fresh: Any = None, out_dtype: Any = None,
                  returns: Tuple[int, ...] = ()) -> None: ...
