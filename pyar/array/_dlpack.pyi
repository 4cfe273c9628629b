# Types of the compiled DLPack capsule helpers (pyar/array/_dlpack.pyx).
from typing import Any, Optional, Tuple

from typing_extensions import disjoint_base

DLPACK_VERSION: Tuple[int, int]
kDLCPU: int
kDLCUDA: int
kDLCUDAHost: int
kDLROCM: int
kDLROCMHost: int
kDLCUDAManaged: int
FLAG_READ_ONLY: int
FLAG_IS_COPIED: int

def export(holder: Any, data: int, shape: Tuple[int, ...], code: int, bits: int,
           device_type: int, device_id: int, *, versioned: bool, readonly: bool = False,
           copied: bool = False) -> Any: ...

@disjoint_base
class ImportedTensor:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    @property
    def ptr(self) -> int: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def strides(self) -> Optional[Tuple[int, ...]]: ...
    @property
    def code(self) -> int: ...
    @property
    def bits(self) -> int: ...
    @property
    def lanes(self) -> int: ...
    @property
    def device_type(self) -> int: ...
    @property
    def device_id(self) -> int: ...
    @property
    def is_readonly(self) -> bool: ...
    @property
    def version(self) -> Optional[Tuple[int, int]]: ...

def consume(capsule: Any) -> ImportedTensor: ...
