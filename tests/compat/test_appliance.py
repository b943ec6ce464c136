"""`cerebras.appliance`: every import Model Zoo makes (read from `API_USED.md`), and the
behaviour of the parts that mean something off a Cerebras system."""
import logging
import os
import pickle
import re

import pytest
import torch

from tests.conftest import SHARED

API_USED = os.path.join(SHARED, "modelzoo", "API_USED.md")


def _appliance_imports():
    with open(API_USED) as f:
        text = f.read()
    section = text[text.index("## cerebras.appliance"):]
    names = re.findall(r"^\|\s*\d+\s*\|\s*`(cerebras\.appliance\.[\w.]+)`\s*\|", section, re.M)
    assert len(names) == 32, f"API_USED.md lists {len(names)} cerebras.appliance imports"
    return names


@pytest.mark.parametrize("name", _appliance_imports())
def test_import_from_api_used(name):
    module, attr = name.rsplit(".", 1)
    namespace = {}
    exec(f"from {module} import {attr}", namespace)
    assert namespace[attr] is not None


def test_appliance_does_not_import_cstorch_until_storage_is_used(tmp_path):
    import subprocess
    import sys
    code = ("import sys, cerebras.appliance.log, cerebras.appliance.errors, "
            "cerebras.appliance.utils.units, cerebras.appliance.storage; "
            "print('torch' in sys.modules, 'cstorch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out == ["False", "False"]


# -- log ---------------------------------------------------------------------------------

def test_level_names():
    from cerebras.appliance.log import TRACE, VERBOSE, get_level_name
    assert get_level_name("info") == logging.INFO
    assert get_level_name("WARNING") == logging.WARNING
    assert get_level_name("trace") == TRACE == logging.DEBUG - 5
    assert get_level_name("Verbose") == VERBOSE == logging.INFO - 5
    assert get_level_name("15") == 15 and get_level_name(30) == 30
    assert logging.getLevelName(TRACE) == "TRACE"
    with pytest.raises(ValueError, match="invalid logging level 'loud'.*INFO"):
        get_level_name("loud")
    with pytest.raises(ValueError, match="invalid logging level"):
        get_level_name(None)


def test_class_logger(caplog):
    from cerebras.appliance.log import ClassLogger, named_class_logger

    @named_class_logger("RunScheduleTest")
    class Named(ClassLogger):
        def hello(self):
            self.logger.info("hello from %s", type(self).__name__)

    class Plain(ClassLogger):
        pass

    assert Named.logger is logging.getLogger("RunScheduleTest")
    assert Named().logger is Named.logger
    assert Plain.logger.name == f"{__name__}.test_class_logger.<locals>.Plain"
    with caplog.at_level(logging.INFO):
        Named().hello()
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("RunScheduleTest", "hello from Named")]
    with pytest.raises(TypeError, match="logger name"):
        named_class_logger(3)


def test_wsc_levels_are_collected():
    from cerebras.appliance.log import collect_wsc_log_settings, wsc_logger
    child = wsc_logger.getChild("crd")
    try:
        wsc_logger.setLevel(logging.WARNING)
        child.setLevel(logging.DEBUG)
        settings = collect_wsc_log_settings()
        assert settings[""] == logging.WARNING and settings["crd"] == logging.DEBUG
    finally:
        wsc_logger.setLevel(logging.NOTSET)
        child.setLevel(logging.NOTSET)
    assert collect_wsc_log_settings() == {}


def test_package_logger():
    from cerebras.appliance import logger
    assert logger is logging.getLogger("cerebras.appliance")


# -- errors ------------------------------------------------------------------------------

def test_error_hierarchy_and_messages():
    from cerebras.appliance import errors
    classes = [errors.ApplianceCompilationError, errors.ApplianceNanError,
               errors.ApplianceDeadlockError, errors.ApplianceUnknownError,
               errors.ClusterJobCancelledByCsctl]
    for cls in classes:
        assert issubclass(cls, errors.ApplianceError) and issubclass(cls, Exception)
        # Siblings: Model Zoo's isinstance chain must match exactly one branch.
        assert [c for c in classes if issubclass(cls, c)] == [cls]
        err = cls("NaN loss detected. step 3")
        assert str(err) == "NaN loss detected. step 3"
        back = pickle.loads(pickle.dumps(err))  # errors cross process boundaries
        assert type(back) is cls and str(back) == str(err)


# -- utils -------------------------------------------------------------------------------

def test_units():
    from cerebras.appliance.utils.units import bytes_to_human, convert_byte_unit
    assert convert_byte_unit(10, "B", src_unit="GB") == 10 * 10 ** 9
    assert convert_byte_unit(3, "B", src_unit="gib") == 3 * 2 ** 30
    assert convert_byte_unit(1536, "KiB") == 1.5
    assert convert_byte_unit(2048, "KiB") == 2 and isinstance(convert_byte_unit(2048, "KiB"), int)
    assert convert_byte_unit(1, "MB", src_unit="GB") == 1000
    with pytest.raises(ValueError, match="unknown source byte unit 'GX'"):
        convert_byte_unit(1, "B", src_unit="GX")
    with pytest.raises(ValueError, match="unknown source byte unit ''"):
        convert_byte_unit(1, "B", src_unit="")
    assert bytes_to_human(12) == "12 B"
    assert bytes_to_human(1536) == "1.50 KiB"
    assert bytes_to_human(5 * 2 ** 30) == "5.00 GiB"
    assert bytes_to_human(2_500_000, binary=False) == "2.50 MB"
    assert bytes_to_human(3 * 2 ** 60) == "3072.00 PiB"


def test_create_symlink(tmp_path):
    from cerebras.appliance.utils.file import create_symlink
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    link = tmp_path / "latest"
    create_symlink(link, "run1", target_is_directory=True)
    assert os.readlink(link) == "run1" and link.resolve() == (tmp_path / "run1").resolve()
    create_symlink(link, "run2", target_is_directory=True)  # replaces the old link
    assert os.readlink(link) == "run2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "run1", "run2"]
    with pytest.raises(IsADirectoryError, match="a directory is there"):
        create_symlink(tmp_path / "run1", "run2")


def test_retrieve_all_subclasses():
    from cerebras.appliance.utils.classes import retrieve_all_subclasses

    class A:
        pass

    class B(A):
        pass

    class C(B):
        pass

    class D(C, B):  # reached through B and through C, listed once
        pass

    assert retrieve_all_subclasses(A) == [B, C, D]
    import cstorch
    names = {c.__name__ for c in retrieve_all_subclasses(cstorch.optim.Optimizer)}
    assert {"SGD", "Adam", "AdamW"} <= names


def test_environment_reaches_os_environ():
    from cerebras.appliance.environment import appliance_environ
    key = "CEREBRAS_APPLIANCE_TEST_VAR"
    try:
        appliance_environ[key] = "1"
        assert os.environ[key] == "1" and dict(appliance_environ)[key] == "1"
        with pytest.raises(TypeError, match="str -> str"):
            appliance_environ[key] = 1
    finally:
        appliance_environ.pop(key, None)
    assert key not in os.environ and key not in appliance_environ


def test_debug_args_and_ini(tmp_path):
    from cerebras.appliance.utils.debug_args import (
        DebugArgs,
        get_debug_args,
        update_debug_args_from_keys,
        write_debug_args,
    )
    from cerebras.appliance.utils.ini import set_default_ini, set_ini
    args = DebugArgs()
    assert not args and get_debug_args(None) == DebugArgs()
    update_debug_args_from_keys(args, {"debug_usr.compile.threads": 4, "flag": True})
    set_ini(args, ws_opt_bidir_act=False)
    set_default_ini(args, ws_opt_bidir_act=True, ws_variable_lanes=True)  # user's value wins
    assert args.to_dict() == {"debug_usr": {"compile": {"threads": 4}}, "flag": True,
                              "ini": {"ws_opt_bidir_act": False, "ws_variable_lanes": True}}
    path = tmp_path / ".debug_args.proto"
    write_debug_args(args, path)
    assert get_debug_args(path) == args
    merged = DebugArgs(ini={"extra": 1})
    merged.MergeFrom(get_debug_args(path))
    assert merged.ini.extra == 1 and merged.debug_usr.compile.threads == 4
    with pytest.raises(ValueError, match="'flag' is a value"):
        update_debug_args_from_keys(args, {"flag.x": 1})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_debug_args(tmp_path / "missing")
    (tmp_path / "proto.txt").write_text("debug_usr { x: 1 }")
    with pytest.raises(ValueError, match="not JSON"):
        get_debug_args(tmp_path / "proto.txt")


def test_telemetry_client_is_a_checked_no_op():
    from cerebras.appliance.cluster.client import TelemetryClient
    with TelemetryClient(mgmt_client=None, max_buffer_size=5) as client:
        client.push({"auto_restart_job": 1}, labels={"job_id": "j1"})
        with pytest.raises(TypeError, match="must be a number"):
            client.push({"loss": "high"})
        with pytest.raises(TypeError, match="str -> str"):
            client.push({"loss": 1.0}, labels={"step": 3})


# -- storage -----------------------------------------------------------------------------

def _state():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 3, generator=g)
    return {"model": {"0.weight": weight, "0.bias": torch.zeros(4), "tied": weight},
            "optimizer": {"lr": 0.1, "name": "sgd"}, "global_step": 7}


def test_checkpoint_round_trip_through_storage_api(tmp_path):
    import cstorch
    from cerebras.appliance.storage import (
        H5Reader,
        H5Writer,
        StorageDeleter,
        StorageReader,
        StorageWriter,
    )
    state = _state()
    path = tmp_path / "checkpoint_7.mdl"
    assert StorageWriter.is_valid_path(path) and not StorageWriter.path_exists(path)
    cstorch.save(state, path)

    assert StorageReader.path_exists(str(path)) and StorageReader.get_type(path) is H5Reader
    with StorageReader.get(path) as reader:
        assert isinstance(reader, H5Reader)
        meta = reader.global_metadata
        assert meta["__cstorch_version__"] == cstorch.__version__
        assert meta["__SUCCESS__"] is True and meta["__version__"] == 0.5
        assert not [k for k in meta if k.endswith(".__metadata__")]
        assert reader.fstat.st_size == os.path.getsize(path)
        assert reader.keys() == ["model.0.weight", "model.0.bias", "model.tied",
                                 "optimizer.lr", "optimizer.name", "global_step"]
        assert torch.equal(reader.read("model.0.weight"), state["model"]["0.weight"])
        assert reader.read("global_step") == 7
        with pytest.raises(KeyError, match="no entry 'model.1.weight'"):
            reader.read("model.1.weight")
        loaded = reader.load(map_location="cpu")

    copy = tmp_path / "copy.mdl"
    writer = StorageWriter.get(copy)
    assert isinstance(writer, H5Writer)
    writer.write(loaded)
    back = cstorch.load(copy, map_location="cpu")
    assert back["model"]["tied"] is back["model"]["0.weight"]
    assert torch.equal(back["model"]["0.weight"], state["model"]["0.weight"])
    assert back["optimizer"] == state["optimizer"] and back["global_step"] == 7

    by_key = tmp_path / "by_key.mdl"
    with H5Writer(by_key) as w:
        w["weight"] = state["model"]["0.weight"]
        w["step"] = 7
    assert H5Reader(by_key).keys() == ["weight", "step"]

    StorageDeleter.get(copy).delete()
    assert not os.path.exists(copy)
    StorageDeleter.get(copy).delete()  # already gone: nothing to do
    assert StorageReader.path_exists(path)


def test_reader_errors(tmp_path):
    from cerebras.appliance.storage import H5Reader
    with pytest.raises(FileNotFoundError, match="does not exist"):
        H5Reader(tmp_path / "missing.mdl")
    torch.save({"a": torch.ones(2)}, tmp_path / "plain.pt")
    reader = H5Reader(tmp_path / "plain.pt")
    assert reader.global_metadata == {} and reader.keys() == ["a"]


def test_s3_is_refused(tmp_path):
    from cerebras.appliance.storage import (
        S3Reader,
        S3Writer,
        StorageDeleter,
        StorageReader,
        StorageWriter,
        UnsupportedStorageError,
    )
    from cerebras.appliance.storage.s3_storage import S3Deleter
    url = "s3://bucket/run/checkpoint_10.mdl"
    assert S3Reader.is_valid_path(url) and S3Deleter.is_valid_path(url)
    assert not S3Writer.is_valid_path(tmp_path / "local.mdl")
    assert StorageWriter.is_valid_path(url) and StorageReader.get_type(url) is S3Reader
    refusals = [lambda: StorageReader.get(url), lambda: StorageWriter.get(url),
                lambda: StorageDeleter.get(url).delete(), lambda: S3Reader.path_exists(url),
                lambda: StorageWriter.path_exists(url), lambda: S3Deleter(url)]
    for refuse in refusals:
        with pytest.raises(UnsupportedStorageError,
                           match=r"S3 storage is not supported; only local paths are supported"):
            refuse()
    assert issubclass(UnsupportedStorageError, NotImplementedError)
    with pytest.raises(UnsupportedStorageError, match="'gs://' paths; only local paths"):
        StorageReader.get("gs://bucket/x.mdl")
