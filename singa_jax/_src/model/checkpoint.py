"""SINGA's checkpoint format: ``Model.save_states`` / ``Model.load_states``.

A checkpoint is a zip archive (any file name; SINGA adds no extension) holding two members:

``tensor_dict.npz``
    ``numpy.savez`` of every state, keyed by its name (``conv1.W``, ``bn1.running_mean``, ...,
    then the auxiliary states under the names the caller gave them).
``states_attr.json``
    ``{name: {"state_type": 0 | 1, "shape": [...], "dtype": <SINGA dtype code>}}``: state type 0
    is a model state (parameter or buffer), 1 an auxiliary state (epoch, optimizer slots, ...);
    the dtype code is SINGA's C++ enum (0 float32, 1 float16, 2 int32, 3 int8, 4 float64,
    5 int64).

This is exactly what SINGA 5.1 writes and reads, so checkpoints move both ways. Differences on
purpose: the archive is written to a temporary file in the target's folder and moved into place
with ``os.replace``, saving over an existing file needs ``overwrite=True`` (SINGA always
refuses), and a file is fully read and checked before the caller changes anything.

Interrupted saves. An exception (KeyboardInterrupt included) removes the temporary file at
once. A process killed outright (SIGKILL, power loss) cannot clean up: the previous checkpoint
is intact, and its temporary file ``.<name>.<pid>-<random>.tmp`` stays until the next save
into the same folder removes every such file whose process is no longer running. (Files of
running processes are left alone, since they may be saving right now; so are all of them on
Windows, where a process cannot be probed safely, and files of a recycled pid.)
"""
from __future__ import annotations

import io
import json
import os
import re
import tempfile
import zipfile
import zlib
from typing import Any, Dict, Mapping, Tuple

import numpy as np

from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.tensor.creation import to_numpy
from singa_jax._src.base.dtypes import singa_dtype_code

__all__ = ["TENSOR_DICT_FILENAME", "STATES_ATTR_FILENAME", "MODEL_STATE_TYPE", "AUX_STATE_TYPE",
           "save_states", "write_archive", "read_states", "check_against", "host_array",
           "is_state_value"]

TENSOR_DICT_FILENAME = "tensor_dict.npz"
STATES_ATTR_FILENAME = "states_attr.json"
MODEL_STATE_TYPE = 0
AUX_STATE_TYPE = 1


def is_state_value(value: Any) -> bool:
    """Whether a checkpoint can hold ``value``: a Tensor, an array or a number (not a bool)."""
    return isinstance(value, Tensor) or (hasattr(value, "shape") and hasattr(value, "dtype")) \
        or (isinstance(value, (int, float, np.number)) and not isinstance(value, bool))


def host_array(what: str, name: str, value: Any) -> np.ndarray:
    """``value`` (a Tensor, array or number) as a NumPy array for the archive."""
    if not is_state_value(value):
        raise TypeError(f"save_states: {what} '{name}' must be a Tensor, an array or a number, got "
                        f"{type(value).__name__}")
    if isinstance(value, Tensor):
        arr = to_numpy(value)
    elif hasattr(value, "shape"):
        arr = np.asarray(value)
    else:
        arr = np.asarray(value, np.float32 if isinstance(value, float) else np.int32)
    if arr.dtype.kind == "V" or arr.dtype.name == "bfloat16":  # no SINGA/NumPy code: widen
        arr = arr.astype(np.float32)
    return arr


def _checked_path(op: str, fpath: Any) -> str:
    """``fpath`` as a str path, or an error naming the path and the problem (None, not a path,
    empty, a directory)."""
    if not isinstance(fpath, (str, bytes, os.PathLike)):
        raise TypeError(f"{op}: the checkpoint path must be a str or os.PathLike, got "
                        f"{type(fpath).__name__} {fpath!r}")
    path = os.fspath(fpath)
    path = os.fsdecode(path) if isinstance(path, bytes) else path
    if not path:
        raise ValueError(f"{op}: the checkpoint path is empty")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{op}: {path!r} is a directory, not a checkpoint file; give a "
                                f"file path such as {os.path.join(path, 'checkpoint.zip')!r}")
    return path


# the temporary file of a save: ".<name>.<pid>-<mkstemp's random part>.tmp"
_TEMP_NAME = re.compile(r"^\..+\.(?P<pid>\d+)-[a-z0-9_]+\.tmp$")


def _temp_prefix(fpath: str) -> str:
    return f".{os.path.basename(fpath)}.{os.getpid()}-"


def _process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs (False when unsure: then its file is kept)."""
    if os.name == "nt" or pid == os.getpid():  # os.kill on Windows would terminate it
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # e.g. PermissionError: it runs, as another user
        return False
    return False


def _remove_stale_temp_files(folder: str) -> None:
    """Delete the temporary files that saves killed midway left in ``folder`` (those whose
    writing process has ended); best effort, never an error."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if match and entry.is_file(follow_symlinks=False) and _process_gone(int(match["pid"])):
            try:
                os.remove(entry.path)
            except OSError:
                pass  # removed by another save meanwhile, or not ours to remove


def save_states(fpath: str, model_states: Mapping[str, Any], aux_states: Mapping[str, Any] = None,
                overwrite: bool = False, compress: bool = True) -> None:
    """Write ``model_states`` (state type 0) and ``aux_states`` (type 1) to ``fpath`` atomically.

    Raises FileExistsError when ``fpath`` exists and ``overwrite`` is False, IsADirectoryError
    when it is a folder, ValueError when a name is used twice, TypeError for a path that is not
    one and for values that are not tensors/arrays/numbers. Temporary files of earlier saves
    into the same folder that were killed midway are removed (see the module docstring).
    ``compress=False`` stores the arrays uncompressed (SINGA reads both; float weights shrink
    little and deflating them costs seconds per 100 MB).
    """
    fpath = _checked_path("save_states", fpath)
    if os.path.exists(fpath) and not overwrite:
        raise FileExistsError(f"save_states: {fpath!r} already exists; pass overwrite=True to "
                              f"replace it")
    folder = os.path.dirname(os.path.abspath(fpath))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"save_states: folder {folder!r} of {fpath!r} does not exist")
    aux_states = dict(aux_states or {})
    clash = sorted(set(model_states) & set(aux_states))
    if clash:
        raise ValueError(f"save_states: aux state name(s) {clash} are also model state names")
    arrays: Dict[str, np.ndarray] = {}
    types: Dict[str, int] = {}
    for state_type, what, states in ((MODEL_STATE_TYPE, "model state", model_states),
                                     (AUX_STATE_TYPE, "aux state", aux_states)):
        for name, value in states.items():
            arrays[str(name)] = host_array(what, name, value)
            types[str(name)] = state_type
    write_archive(fpath, arrays, types, compress=compress)


def write_archive(fpath: str, arrays: Mapping[str, np.ndarray], state_types: Mapping[str, int],
                  compress: bool = True) -> None:
    """Write the checkpoint of host ``arrays`` (their state types by name) to ``fpath``: into a
    temporary file of its folder, flushed to disk, then moved over ``fpath`` (atomic). The
    arrays are streamed into the archive, never copied whole into memory first."""
    fpath = os.fspath(fpath)
    folder = os.path.dirname(os.path.abspath(fpath))
    attrs = {name: {"state_type": state_types[name], "shape": list(arr.shape),
                    "dtype": singa_dtype_code(arr.dtype)} for name, arr in arrays.items()}
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    _remove_stale_temp_files(folder)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(fpath), suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, mode="w", compression=method) as zf:
                # the member is itself an .npz (SINGA's layout): a zip of one .npy per state
                with zf.open(TENSOR_DICT_FILENAME, "w", force_zip64=True) as member:
                    with zipfile.ZipFile(member, mode="w", compression=method) as npz:
                        for name, arr in arrays.items():
                            with npz.open(name + ".npy", "w", force_zip64=True) as out:
                                np.lib.format.write_array(out, np.asanyarray(arr),
                                                          allow_pickle=False)
                zf.writestr(STATES_ATTR_FILENAME, json.dumps(attrs))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it owner-only; a save should not
        os.replace(tmp, fpath)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _corrupt(fpath: str, why: str) -> ValueError:
    return ValueError(f"load_states: {fpath!r} is not a valid SINGA checkpoint: {why}")


def read_states(fpath: str) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """Read and check a checkpoint: ``(model_states, aux_states)`` as NumPy arrays by name.

    Raises FileNotFoundError for a missing file and ValueError for anything that is not a
    well-formed checkpoint (not a zip, a member missing or damaged, names or shapes in the two
    members disagreeing, an unknown state type).
    """
    fpath = _checked_path("load_states", fpath)
    if not os.path.isfile(fpath):
        raise FileNotFoundError(f"load_states: {fpath!r} does not exist")
    try:
        with zipfile.ZipFile(fpath, "r") as zf:
            members = {os.path.basename(n): n for n in zf.namelist()}
            missing = [m for m in (TENSOR_DICT_FILENAME, STATES_ATTR_FILENAME) if m not in members]
            if missing:
                raise _corrupt(fpath, f"member(s) {missing} missing (found {sorted(members)})")
            attrs_bytes = zf.read(members[STATES_ATTR_FILENAME])
            npz_bytes = zf.read(members[TENSOR_DICT_FILENAME])
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError) as e:
        raise _corrupt(fpath, f"{type(e).__name__}: {e}") from e
    attrs = _parse_attrs(fpath, attrs_bytes)
    arrays = _parse_arrays(fpath, npz_bytes)
    if not isinstance(attrs, dict):
        raise _corrupt(fpath, f"{STATES_ATTR_FILENAME} holds a {type(attrs).__name__}, not a dict")
    if set(attrs) != set(arrays):
        raise _corrupt(fpath, f"names in {STATES_ATTR_FILENAME} and {TENSOR_DICT_FILENAME} differ: "
                              f"only in attributes {sorted(set(attrs) - set(arrays))}, only in "
                              f"arrays {sorted(set(arrays) - set(attrs))}")
    model_states, aux_states = {}, {}
    for name, arr in arrays.items():
        attr = attrs[name]
        state_type = attr.get("state_type") if isinstance(attr, dict) else None
        if state_type not in (MODEL_STATE_TYPE, AUX_STATE_TYPE):
            raise _corrupt(fpath, f"'{name}' has state_type {state_type!r}, expected 0 or 1")
        shape = attr.get("shape")
        if shape is not None and tuple(shape) != arr.shape:
            raise _corrupt(fpath, f"'{name}' is recorded with shape {tuple(shape)} but holds an "
                                  f"array of shape {arr.shape}")
        (model_states if state_type == MODEL_STATE_TYPE else aux_states)[name] = arr
    return model_states, aux_states


def _parse_attrs(fpath: str, data: bytes) -> Any:
    """The JSON of member ``states_attr.json``, or an error naming the member."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _corrupt(fpath, f"member {STATES_ATTR_FILENAME} is not valid UTF-8 JSON "
                              f"({type(e).__name__}: {e})") from e


def _parse_arrays(fpath: str, data: bytes) -> Dict[str, np.ndarray]:
    """The arrays of member ``tensor_dict.npz``, or an error naming the member and the problem
    (not an .npz archive at all, an array that does not parse, pickled objects)."""
    if not data.startswith(b"PK"):  # an .npz is a zip archive
        raise _corrupt(fpath, f"member {TENSOR_DICT_FILENAME} is not a NumPy .npz archive "
                              f"({len(data)} bytes starting {data[:8]!r})")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except ValueError as e:
        if "pickle" in str(e):
            raise _corrupt(fpath, f"member {TENSOR_DICT_FILENAME} holds pickled Python objects, "
                                  f"which a checkpoint never contains and which are not "
                                  f"loaded") from e
        raise _corrupt(fpath, f"member {TENSOR_DICT_FILENAME} is damaged: {e}") from e
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError) as e:
        raise _corrupt(fpath, f"member {TENSOR_DICT_FILENAME} is damaged "
                              f"({type(e).__name__}: {e})") from e


def check_against(owner: str, current: Mapping[str, Tensor], loaded: Mapping[str, np.ndarray],
                  fpath: str) -> None:
    """Raise ValueError unless ``loaded`` has exactly the names of ``current`` with the same
    shapes (so that a load changes all of a model's states or none)."""
    unknown = sorted(set(loaded) - set(current))
    missing = sorted(set(current) - set(loaded))
    wrong = [f"'{k}': file {loaded[k].shape}, model {current[k].shape}"
             for k in sorted(set(loaded) & set(current)) if tuple(loaded[k].shape) !=
             tuple(current[k].shape)]
    problems = []
    if unknown:
        problems.append(f"names the model does not have: {unknown}")
    if missing:
        problems.append(f"model states missing from the file: {missing}")
    if wrong:
        problems.append(f"shape mismatches: {'; '.join(wrong)}")
    if problems:
        raise ValueError(f"{owner}.load_states: {fpath!r} does not match the model ("
                         f"{'; '.join(problems)}); nothing was changed. Compile the model with "
                         f"the same architecture and input shapes before loading")
