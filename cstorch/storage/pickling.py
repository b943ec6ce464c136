"""Unpickling of `ObjectSerializer` payloads without running code from the file.

Only globals on an allow-list of plain data types may be looked up; anything else
raises `UnsafePickleError` unless the caller opts in with `allow_unsafe_pickle=True`.
"""
import io
import pickle

OPT_IN = "allow_unsafe_pickle"

SAFE_GLOBALS = {
    "builtins": {"set", "frozenset", "bytes", "bytearray", "complex", "slice", "range",
                 "dict", "list", "tuple", "int", "float", "str", "bool"},
    "_codecs": {"encode"},
    "collections": {"OrderedDict", "Counter", "defaultdict", "deque"},
    "datetime": {"date", "datetime", "time", "timedelta", "timezone", "tzinfo"},
    "decimal": {"Decimal"},
    "fractions": {"Fraction"},
    "uuid": {"UUID"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "PureWindowsPath", "WindowsPath"},
    "numpy": {"ndarray", "dtype", "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16",
              "uint32", "uint64", "float16", "float32", "float64", "complex64", "complex128"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy.dtypes": {"BoolDType", "Int8DType", "Int16DType", "Int32DType", "Int64DType",
                     "UInt8DType", "UInt16DType", "UInt32DType", "UInt64DType", "Float16DType",
                     "Float32DType", "Float64DType", "Complex64DType", "Complex128DType",
                     "StrDType", "BytesDType", "VoidDType", "ObjectDType"},
    "torch": {"Size", "device", "bfloat16", "float16", "float32", "float64", "int8", "int16",
              "int32", "int64", "uint8", "bool", "complex64", "complex128", "float8_e4m3fn",
              "float8_e5m2", "half", "float", "double", "long", "int", "short", "dtype"},
}


class UnsafePickleError(pickle.UnpicklingError, RuntimeError):
    """A checkpoint holds a pickled object of a type that is not on the safe list."""


class SafeUnpickler(pickle.Unpickler):
    def __init__(self, data, key=""):
        super().__init__(io.BytesIO(data))
        self._key = key

    def find_class(self, module, name):
        if name in SAFE_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        where = f" (entry {self._key!r})" if self._key else ""
        raise UnsafePickleError(
            f"checkpoint entry{where} is a pickled {module}.{name}, which is not on the list of "
            f"types safe to unpickle; unpickling it could run code from the file. If you trust "
            f"the file, load it with cstorch.load(path, {OPT_IN}=True)")


def loads(data: bytes, allow_unsafe: bool = False, key: str = ""):
    if allow_unsafe:
        try:
            import dill  # noqa: PLC0415 (optional: the reference pickles with dill; used when present)
            return dill.loads(data)
        except ImportError:
            return pickle.loads(data)
    return SafeUnpickler(data, key).load()
