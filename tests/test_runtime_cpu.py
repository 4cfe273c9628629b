"""The runtime binding on a machine without a GPU (tier a).

- importing touches no GPU runtime; loading happens at the first call;
- platform selection: PYAR_PLATFORM / PYAR_HIP_LIBRARY / PYAR_CUDA_LIBRARY, and
  the error that names what was tried;
- ROCm for real: Debian's libamdhip64 loads without a GPU and answers
  hipErrorNoDevice, which must surface as a HipError with its fields;
- errors pickle (they cross MPI);
- every public function and class rejects bad arguments with a TypeError /
  ValueError / FileNotFoundError naming the problem, before any GPU call
  (proved by running the same cases with no loadable runtime at all);
- closed objects refuse to be used.

Platform tests run in subprocesses: the runtime is loaded once per process.
"""
import ctypes
import json
import os
import pickle
import subprocess
import sys

import pytest

from pyar import _hip
from pyar._hip.errors import HipError, RuntimeNotFoundError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def loadable(name):
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


HAVE_ROCM = loadable("libamdhip64.so") or loadable("libamdhip64.so.5") or loadable(
    "libamdhip64.so.6") or loadable("libamdhip64.so.7")
HAVE_CUDA = loadable("libcuda.so.1")
AMD_GPU = os.path.exists("/dev/kfd")

needs_rocm = pytest.mark.skipif(not HAVE_ROCM, reason="libamdhip64 is not installed "
                                "(CI installs Debian's libamdhip64-dev)")


def run_python(code, **env):
    """Run ``code`` in a fresh interpreter with the PYAR_* environment given."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYAR_")}
    environment.update(env)
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [ROOT, environment.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)


# Prints {"type": ..., "message": ..., "tried": ...} for the first GPU call.
FIRST_CALL = """
import json
import pyar._hip as h
def outcome(f):
    try:
        return {"type": "ok", "value": f()}
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e), "tried": getattr(e, "tried", None)}
print(json.dumps([outcome(h.platform), outcome(h.platform), outcome(h.get_device_count)]))
"""


def first_call(**env):
    result = run_python(FIRST_CALL, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------
# Import and platform selection


def test_import_loads_no_runtime():
    # With a platform that cannot load, import still works; the first call fails.
    result = run_python("import pyar._hip, pyar._hip.errors; print('imported')",
                        PYAR_PLATFORM="bogus")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_import_pyar_loads_no_runtime():
    result = run_python("import pyar; print(pyar.HipError is pyar._hip.HipError)",
                        PYAR_PLATFORM="bogus")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_unknown_platform_is_named():
    outcomes = first_call(PYAR_PLATFORM="bogus")
    for outcome in outcomes:
        assert outcome["type"] == "RuntimeNotFoundError"
        assert "PYAR_PLATFORM=bogus" in outcome["message"]
        assert "'hip' or 'cuda'" in outcome["tried"]


@pytest.mark.skipif(HAVE_CUDA, reason="libcuda.so.1 loads here: CUDA is not absent")
def test_cuda_requested_without_libcuda():
    outcomes = first_call(PYAR_PLATFORM="cuda")
    # A failed load is not remembered as a success: every call retries and fails.
    for outcome in outcomes:
        assert outcome["type"] == "RuntimeNotFoundError"
        assert "libcuda.so.1" in outcome["tried"]
        assert "CUDA" in outcome["tried"]
        assert "PYAR_PLATFORM" in outcome["message"]  # the message says how to choose


def test_cuda_library_override_is_named(tmp_path):
    missing = str(tmp_path / "no" / "libcuda.so.1")
    outcome = first_call(PYAR_PLATFORM="cuda", PYAR_CUDA_LIBRARY=missing)[0]
    assert outcome["type"] == "RuntimeNotFoundError"
    assert missing in outcome["tried"]


def test_hip_library_override_is_named():
    outcome = first_call(PYAR_PLATFORM="hip", PYAR_HIP_LIBRARY="/nonexistent")[0]
    assert outcome["type"] == "RuntimeNotFoundError"
    assert "/nonexistent" in outcome["tried"]
    assert "ROCm" in outcome["tried"]


def test_hip_library_that_is_not_hip_is_refused():
    # A library that loads but lacks the HIP functions is named with what it lacks.
    outcome = first_call(PYAR_PLATFORM="hip", PYAR_HIP_LIBRARY="libm.so.6")[0]
    assert outcome["type"] == "RuntimeNotFoundError"
    assert "libm.so.6 lacks hipGetLastError" in outcome["tried"]


INFO = """
import json, pickle
import pyar._hip as h
info = {"platform": h.platform(), "library": h.library_path(),
        "runtime_version": h.runtime_version(), "driver_version": h.driver_version()}
try:
    h.get_device_count()
except h.HipError as e:
    info["error"] = {"status": e.status, "name": e.name, "call": e.call, "message": e.message,
                     "str": str(e), "pickle": pickle.dumps(e).hex()}
    # the error was cleared: the runtime still answers, and the same call fails the same way
    info["after"] = h.runtime_version()
    try:
        h.get_device_count()
    except h.HipError as again:
        info["again"] = again.name
print(json.dumps(info))
"""


def rocm_info(**env):
    result = run_python(INFO, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@needs_rocm
@pytest.mark.skipif(HAVE_CUDA, reason="libcuda.so.1 loads here: the default may pick CUDA")
@pytest.mark.skipif(AMD_GPU, reason="an AMD GPU is present (/dev/kfd): no hipErrorNoDevice")
@pytest.mark.parametrize("env", [{}, {"PYAR_PLATFORM": "hip"}, {"PYAR_PLATFORM": " HIP "}],
                         ids=["default", "hip", "hip-spelled-loosely"])
def test_rocm_loads_and_reports_no_device(env):
    info = rocm_info(**env)
    assert info["platform"] == "hip"
    assert "libamdhip64" in info["library"]
    # major*10**7 + minor*10**5 + patch; Debian 12's HIP 5.2 answers 50221153.
    assert 50000000 <= info["runtime_version"] < 100000000
    assert info["driver_version"] > 0
    error = info["error"]
    assert error["status"] == 100
    assert error["name"] == "hipErrorNoDevice"
    assert error["call"] == "hipGetDeviceCount"
    assert isinstance(error["message"], str) and error["message"]
    assert "hipGetDeviceCount" in error["str"] and "hipErrorNoDevice" in error["str"]
    assert info["after"] == info["runtime_version"]
    assert info["again"] == "hipErrorNoDevice"

    # The error crosses a process boundary intact (as it would through MPI).
    received = pickle.loads(bytes.fromhex(error["pickle"]))
    assert type(received) is HipError and isinstance(received, RuntimeError)
    assert (received.status, received.name, received.call, received.message) == (
        100, "hipErrorNoDevice", "hipGetDeviceCount", error["message"])
    assert str(received) == error["str"]


@needs_rocm
def test_rocm_library_override_is_used():
    name = "libamdhip64.so.5" if loadable("libamdhip64.so.5") else "libamdhip64.so"
    if not loadable(name):
        pytest.skip(f"{name} does not load")
    info = rocm_info(PYAR_PLATFORM="hip", PYAR_HIP_LIBRARY=name)
    assert info["platform"] == "hip"
    assert info["library"] == name


# ---------------------------------------------------------------------------
# Errors


def test_hip_error_pickles_with_its_fields():
    error = HipError(1, "hipErrorInvalidValue", "hipMalloc", "invalid argument")
    assert isinstance(error, RuntimeError)
    assert str(error) == "hipMalloc failed: hipErrorInvalidValue (1): invalid argument"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is HipError
    assert (copy.status, copy.name, copy.call, copy.message) == (
        1, "hipErrorInvalidValue", "hipMalloc", "invalid argument")
    assert str(copy) == str(error)


def test_runtime_not_found_error_pickles_with_its_fields():
    error = RuntimeNotFoundError("ROCm: tried /x/libamdhip64.so: no such file")
    assert isinstance(error, RuntimeError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RuntimeNotFoundError
    assert copy.tried == "ROCm: tried /x/libamdhip64.so: no such file"
    assert str(copy) == str(error)
    assert "PYAR_PLATFORM=hip|cuda" in str(copy)


def test_errors_are_exported():
    assert _hip.HipError is HipError
    assert _hip.RuntimeNotFoundError is RuntimeNotFoundError


# ---------------------------------------------------------------------------
# Argument validation: (expression over h = pyar._hip, exception, substrings)

BYTES64 = "b'x' * 64"
VALIDATION = [
    # memory
    ("h.DeviceMemory('1')", TypeError, ["size must be an int", "str"]),
    ("h.DeviceMemory(1.5)", TypeError, ["size must be an int", "float"]),
    ("h.DeviceMemory(True)", TypeError, ["size must be an int", "bool"]),
    ("h.DeviceMemory(-1)", ValueError, ["size must be >= 0", "-1"]),
    ("h.PinnedMemory(-8)", ValueError, ["size must be >= 0", "-8"]),
    ("h.PinnedMemory(None)", TypeError, ["size must be an int", "NoneType"]),
    ("h.memset('p', 0, 1)", TypeError, ["expected a device pointer", "str"]),
    ("h.memset(-1, 0, 1)", ValueError, ["device pointer cannot be negative", "-1"]),
    ("h.memset(0, 256, 1)", ValueError, ["memset value must be a byte (0..255)", "256"]),
    ("h.memset(0, -1, 1)", ValueError, ["memset value must be a byte (0..255)", "-1"]),
    ("h.memset(0, 'a', 1)", TypeError, ["memset value must be an int", "str"]),
    ("h.memset(0, 0, -1)", ValueError, ["size must be >= 0", "-1"]),
    ("h.memset(0, 0, 1.0)", TypeError, ["size must be an int", "float"]),
    ("h.memset(0, 0, 1, stream=object())", TypeError, ["expected a stream", "object"]),
    ("h.memcpy_htod('p', b'ab')", TypeError, ["expected a device pointer", "str"]),
    ("h.memcpy_htod(0, 5)", TypeError, ["bytes-like", "int"]),
    ("h.memcpy_dtoh(b'ab', 0)", BufferError, ["not writable"]),
    ("h.memcpy_dtoh(bytearray(2), -3)", ValueError, ["device pointer cannot be negative"]),
    ("h.memcpy_dtod(0, 0, -1)", ValueError, ["size must be >= 0", "-1"]),
    ("h.memcpy_dtod(0, 'p', 1)", TypeError, ["expected a device pointer", "str"]),
    ("h.pointer_device('p')", TypeError, ["expected a device pointer", "str"]),
    ("h.pointer_device(-5)", ValueError, ["device pointer cannot be negative", "-5"]),
    ("h.address_range(None)", TypeError, ["expected a device pointer", "NoneType"]),
    # devices
    ("h.set_device('0')", TypeError, ["device ordinal must be an int", "str"]),
    ("h.set_device(True)", TypeError, ["device ordinal must be an int", "bool"]),
    ("h.set_device(-1)", ValueError, ["device ordinal must be >= 0", "-1"]),
    ("h.Device(1.0)", TypeError, ["device ordinal must be an int", "float"]),
    ("h.Device(-2)", ValueError, ["device ordinal must be >= 0", "-2"]),
    # streams
    ("h.Stream.from_handle(-1)", ValueError, ["stream handle must be >= 0", "-1"]),
    ("h.Stream.from_handle('x')", TypeError, ["stream handle must be an int", "str"]),
    ("h.Stream.from_handle(False)", TypeError, ["stream handle must be an int", "bool"]),
    ("h.as_stream(object())", TypeError, ["expected a stream", "object"]),
    ("h.as_stream(1.5)", TypeError, ["expected a stream", "float"]),
    ("h.as_stream(-7)", ValueError, ["stream handle must be >= 0", "-7"]),
    ("h.Stream.from_handle(5).begin_capture('bogus')", ValueError,
     ["capture mode must be one of", "'global'", "'relaxed'", "'thread_local'", "'bogus'"]),
    ("h.Stream.null().begin_capture()", ValueError, ["null stream cannot be captured"]),
    ("h.Stream.null().wait(object())", TypeError, ["expected a stream", "object"]),
    ("h.Stream.null().wait_event(None)", TypeError, ["event", "NoneType"]),
    ("h.Stream.null().record(1)", TypeError, ["event", "int"]),
    # code objects and kernels
    ("h.Module.from_bytes(b'')", ValueError, ["code object is empty"]),
    ("h.Module.from_bytes('text')", TypeError, ["code object must be bytes-like", "str"]),
    ("h.Module.from_bytes(None)", TypeError, ["code object must be bytes-like", "NoneType"]),
    ("h.Module.from_file('/nonexistent/k.hsaco')", FileNotFoundError,
     ["no code object at /nonexistent/k.hsaco"]),
    ("h.Module.from_file('/')", FileNotFoundError, ["no code object at /"]),
    ("h.Module.from_file(None)", TypeError, ["NoneType"]),
    ("h.Function(None, 'k')", TypeError, ["module", "NoneType"]),
    ("h.Function(h.Module.__new__(h.Module), 5)", TypeError, ["kernel name must be a str", "int"]),
    ("h.Function(h.Module.__new__(h.Module), 'k', ['ptr', 'int'])", ValueError,
     ["argument 1 of k", "unknown type 'int'", "'int32'"]),
    ("h.Function(h.Module.__new__(h.Module), 'k', ['ptr'] * 33)", ValueError,
     ["at most 32 kernel arguments", "33"]),
    # launch() checks its arguments before the stream, the module or the GPU
    ("h.Function.__new__(h.Function).launch(0, 1)", ValueError, ["grid dimensions", "1..2**31-1"]),
    ("h.Function.__new__(h.Function).launch((1, -1), 1)", ValueError, ["grid dimensions"]),
    ("h.Function.__new__(h.Function).launch(1, 2**31)", ValueError, ["block dimensions"]),
    ("h.Function.__new__(h.Function).launch(1, (1, 1, 1, 1))", ValueError,
     ["block takes 1 to 3 dimensions, got 4"]),
    ("h.Function.__new__(h.Function).launch((), 1)", ValueError,
     ["grid takes 1 to 3 dimensions, got 0"]),
    ("h.Function.__new__(h.Function).launch(1, (2.0,))", ValueError, ["block dimensions"]),
    ("h.Function.__new__(h.Function).launch(1, 1, args=(1,))", TypeError,
     ["takes 0 arguments, got 1"]),
    ("h.Function.__new__(h.Function).launch(1, 1, shared_mem=-1)", ValueError,
     ["shared_mem must be >= 0"]),
    ("h.Function.__new__(h.Function).launch(1, 1, stream='s')", TypeError, ["expected a stream"]),
    # IPC
    ("h.IpcHandle(b'x' * 63, 0, 1)", ValueError, ["IPC handle is 64 bytes", "63"]),
    ("h.IpcHandle(b'x' * 65, 0, 1)", ValueError, ["IPC handle is 64 bytes", "65"]),
    ("h.IpcHandle('x' * 64, 0, 1)", TypeError, ["IPC handle must be bytes", "str"]),
    (f"h.IpcHandle({BYTES64}, -1, 1)", ValueError, ["bad IPC offset/size", "-1/1"]),
    (f"h.IpcHandle({BYTES64}, 2, 1)", ValueError, ["bad IPC offset/size", "2/1"]),
    (f"h.IpcHandle({BYTES64}, 0, -1)", ValueError, ["bad IPC offset/size", "0/-1"]),
    (f"h.IpcHandle({BYTES64}, 0.5, 1)", TypeError, ["IPC offset must be an int", "float"]),
    (f"h.IpcHandle({BYTES64}, 0, '1')", TypeError, ["IPC size must be an int", "str"]),
    ("h.ipc_open(b'x' * 64)", TypeError, ["expected a pyar.IpcHandle", "bytes"]),
    ("h.IpcMapping('handle')", TypeError, ["expected a pyar.IpcHandle", "str"]),
    ("h.ipc_get_handle('p')", TypeError, ["expected a device pointer", "str"]),
    ("h.ipc_get_handle(-1)", ValueError, ["device pointer cannot be negative"]),
]
VALIDATION_IDS = [case[0][2:] for case in VALIDATION]


@pytest.mark.parametrize("expression, error, words", VALIDATION, ids=VALIDATION_IDS)
def test_bad_arguments_are_refused(expression, error, words):
    with pytest.raises(error) as caught:
        eval(expression, {"h": _hip})
    assert type(caught.value) is error
    for word in words:
        assert word in str(caught.value), (expression, str(caught.value))


def test_bad_arguments_are_refused_before_loading_a_runtime():
    """The same cases in a process where no runtime can load: each must still
    raise its own error, not RuntimeNotFoundError (no GPU call came first)."""
    code = (
        "import json, sys\nimport pyar._hip as h\nout = []\n"
        "for expression in json.loads(sys.argv[1]):\n"
        "    try:\n        eval(expression)\n        out.append(['no error', ''])\n"
        "    except Exception as e:\n        out.append([type(e).__name__, str(e)])\n"
        "print(json.dumps(out))\n")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYAR_")}
    environment.update(PYAR_PLATFORM="bogus", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", code, json.dumps([c[0] for c in VALIDATION])],
                            cwd=ROOT, env=environment, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout)
    wrong = [(expression, got) for (expression, error, words), got in zip(VALIDATION, outcomes)
             if got[0] != error.__name__ or not all(word in got[1] for word in words)]
    assert not wrong, "\n".join(f"{expression} -> {kind}: {message}"
                                 for expression, (kind, message) in wrong)


def test_valid_ipc_handle_round_trips():
    handle = _hip.IpcHandle(bytes(range(64)), 16, 4096)
    copy = pickle.loads(pickle.dumps(handle))
    assert copy == handle and hash(copy) == hash(handle)
    assert (copy.handle, copy.offset, copy.size) == (bytes(range(64)), 16, 4096)
    assert copy != _hip.IpcHandle(bytes(range(64)), 0, 4096)


def test_as_stream_accepts_the_stream_protocols():
    assert _hip.as_stream(None).handle == 0
    assert _hip.as_stream(None) is _hip.as_stream(None)
    s = _hip.Stream.from_handle(1234)
    assert _hip.as_stream(s) is s
    assert _hip.as_stream(1234) == s

    class CuPyLike:
        def __cuda_stream__(self):
            return (0, 4321)

    class TorchLike:
        cuda_stream = 999

    foreign = CuPyLike()
    wrapped = _hip.as_stream(foreign)
    assert wrapped.handle == 4321
    assert _hip.as_stream(TorchLike()).handle == 999
    assert s.__cuda_stream__() == (0, 1234)


# ---------------------------------------------------------------------------
# Closed objects


def test_closed_stream_refuses_use():
    stream = _hip.Stream.from_handle(1234)
    stream.close()
    stream.close()  # closing twice is fine
    assert stream.closed
    assert "closed" in repr(stream)
    for use in (stream.synchronize, stream.query, stream.__cuda_stream__,
                stream.end_capture, lambda: stream.begin_capture("global"),
                lambda: stream.capture_status,
                lambda: _hip.memset(0, 0, 0, stream=stream),
                lambda: _hip.memcpy_dtod(0, 0, 1, stream=stream)):
        with pytest.raises(ValueError, match="stream is closed"):
            use()


def test_closed_null_stream_refuses_use():
    stream = _hip.Stream.null()
    assert stream.handle == 0 and not stream.closed
    stream.close()
    with pytest.raises(ValueError, match="stream is closed"):
        stream.synchronize()
    # the shared null stream of as_stream(None) is not affected
    assert not _hip.as_stream(None).closed


def test_unloaded_module_refuses_use():
    module = _hip.Module.__new__(_hip.Module)
    assert module.closed
    module.unload()  # nothing to unload: fine
    with pytest.raises(ValueError, match="unloaded"):
        module.get_function("k")
    with pytest.raises(ValueError, match="unloaded"):
        module.get_global("g")


def test_destroyed_graphs_refuse_use():
    graph = _hip.Graph.__new__(_hip.Graph)
    assert graph.closed
    graph.close()
    with pytest.raises(ValueError, match="graph is destroyed"):
        graph.instantiate()
    executable = _hip.GraphExec.__new__(_hip.GraphExec)
    assert executable.closed
    executable.close()
    with pytest.raises(ValueError, match="graph executable is destroyed"):
        executable.launch()


def test_unopened_objects_close_quietly():
    memory = _hip.DeviceMemory.__new__(_hip.DeviceMemory)
    assert memory.closed
    memory.free()
    memory.free()
    mapping = _hip.IpcMapping.__new__(_hip.IpcMapping)
    assert mapping.closed
    mapping.close()


FOREIGN_STREAM_FIRST = """
import pyar._hip as h
s = h.Stream.from_handle(4096)
for use in (lambda: s.begin_capture(), s.end_capture, lambda: s.capture_status,
            s.synchronize, s.query):
    try:
        use()
        print("no error")
    except Exception as e:
        print(type(e).__name__)
"""


def test_foreign_stream_as_the_first_call_loads_the_runtime():
    # Capture on a wrapped stream before any other pyar call used to call
    # through the unfilled dispatch table (a segfault).
    result = run_python(FOREIGN_STREAM_FIRST, PYAR_PLATFORM="bogus")
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert result.stdout.split() == ["RuntimeNotFoundError"] * 5
