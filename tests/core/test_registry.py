"""The registry against real, pip-installed test plugins (tests/plugins/*).

Every scenario runs in a fresh subprocess (see ``plugin_dists.PluginEnv``): the
registry loads once per process, and entry points must come from real metadata.
Environment variables are set inside the process after ``import tensorplug`` and
before the registry's first use, as an application would.
"""

from __future__ import annotations

import pytest
from plugin_dists import PluginEnv

from tensorplug import hooks
from tensorplug.device import Device, Reg
from tensorplug.errors import ApiVersionError, PluginError
from tensorplug.registration import Registration, check_api_version
from tensorplug.settings import BACKENDS, STRICT_PLUGINS, SettingError
from tensorplug.version import API_VERSION

PRELUDE = """
import os, sys, logging
import tensorplug
from tensorplug import registry as r
from tensorplug.device import DeviceType
from tensorplug.errors import PluginError, BackendNotFoundError

def raised(fn, *args):
    try:
        fn(*args)
    except Exception as e:
        cause = e.__cause__
        return {"type": type(e).__name__, "msg": str(e),
                "cause": type(cause).__name__ if cause else None}
    return None

def status(dist):
    recs = [x for x in r.plugin_records() if x.distribution == dist]
    return [x.status.value for x in recs][0]
"""


def run(env: PluginEnv, code: str, **environ: str) -> dict:
    return env.run_py(PRELUDE + code, environ)


def test_import_does_not_discover(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
import tensorplug.registry, tensorplug.cli, tensorplug.hooks
from importlib import metadata
result = {
    "tp": sorted(m for m in sys.modules if m.startswith("tp_")),
    "loaded": r._state.loaded,
    "installed": sorted(ep.name for ep in metadata.entry_points(group="tensorplug.backends")),
}
""",
    )
    assert out["tp"] == [] and out["loaded"] is False
    # the set-up really installed the distributions: their entry points are in metadata
    assert {"test", "variant", "broken_import", "wrongapi"} <= set(out["installed"])


def test_load_all_selects_variants_and_records_every_plugin(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
seen = []
class Count(logging.Handler):
    def emit(self, rec):
        seen.append(rec.levelname)
logging.getLogger("tensorplug.registry").addHandler(Count())
r.load_all(); r.load_all(); r.dev_count(); r.init_best()
recs = {x.distribution: x for x in r.plugin_records()}
result = {
    "regs": [x.name for x in r.regs()],
    "devices": [d.name for d in r.devices()],
    "status": {k: [v.status.value, v.stage, v.score, v.reason, v.detail] for k, v in recs.items()},
    "variant": r.reg_by_name("variant").features()["variant"],
    "modules": sorted(m for m in sys.modules if m.startswith("tp_")),
    "warnings": seen.count("WARNING"),
}
""",
    )
    assert out["regs"] == ["REENTRANT", "TEST", "VARIANT"]
    assert out["devices"] == ["REENTRANT0", "TEST0", "TEST1", "VARIANT0"]
    st = out["status"]
    assert st["tp-good"][:3] == ["loaded", None, 10]
    assert st["tp-variant-fast"][:3] == ["loaded", None, 20]
    assert out["variant"] == "fast"
    assert st["tp-variant-basic"][0] == "not selected"
    assert "tp-variant-fast 0.1.0" in st["tp-variant-basic"][4]
    assert "scored higher (20 > 5)" in st["tp-variant-basic"][4]
    assert st["tp-unsupported"][:4] == [
        "unsupported",
        None,
        0,
        "no FooGPU driver found (tp-unsupported)",
    ]
    assert st["tp-broken-import"][:2] == ["failed", "import"]
    assert st["tp-broken-init"][:2] == ["failed", "init"]
    assert st["tp-broken-score"][:2] == ["failed", "score"]
    assert st["tp-wrong-api"][:3] == ["failed", "api", None]  # refused before scoring
    assert st["tp-badhook"][:2] == ["failed", "register"]
    assert st["tp-reentrant"][0] == "loaded"
    # losers and refused plugins never had their heavy part imported
    mods = set(out["modules"])
    assert "tp_variant_fast.backend" in mods and "tp_good.device" in mods
    assert not {"tp_variant_basic.backend", "tp_wrong_api.backend", "tp_unsupported.backend"} & mods
    assert out["warnings"] == 1  # once, however many failures and calls


def test_failure_messages_name_plugin_cause_and_fix(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
recs = {x.distribution: x for x in r.plugin_records()}
result = {k: [v.error_message(), v.traceback] for k, v in recs.items() if v.failed}
""",
    )
    msg, tb = out["tp-broken-import"]
    assert msg.startswith(
        "plugin 'broken_import' from tp-broken-import 0.1.0 (entry point 'broken_import' = "
        "tp_broken_import:registration) could not be imported: ModuleNotFoundError: No module "
        "named 'tp_missing_gpu_sdk'. Fix: reinstall or upgrade it (pip install -U "
        "tp-broken-import)"
    )
    assert "tp_broken_import/__init__.py" in tb and tb.startswith("Traceback")
    msg, _ = out["tp-wrong-api"]
    assert "tp-wrong-api 0.1.0 was built for tensorplug plugin API 2.0" in msg
    assert "provides plugin API {}.{}".format(*API_VERSION) in msg
    assert "Fix: upgrade tensorplug (pip install -U tensorplug)" in msg
    msg, tb = out["tp-broken-init"]
    assert "failed to initialise: RuntimeError: device handshake failed (tp-broken-init)" in msg
    assert "TENSORPLUG_DISABLE=BROKENINIT" in msg and "tp_broken_init/__init__.py" in tb
    msg, _ = out["tp-broken-score"]
    assert "failed to score itself: OSError: cannot read /dev/tp-broken-score" in msg
    msg, _ = out["tp-badhook"]
    assert "'tensorplug_extra_buffer_type' is not a tensorplug hook" in msg
    assert "did you mean 'tensorplug_extra_buffer_types'?" in msg


def test_registry_queries_follow_ggml(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
result = {
    "reg_count": r.reg_count(),
    "reg_get": r.reg_get(1).name,
    "reg_by_name": r.reg_by_name("vArIaNt").name,
    "no_reg": r.reg_by_name("nope"),
    "dev_count": r.dev_count(),
    "dev_get": r.dev_get(0).name,
    "dev_by_name": r.dev_by_name("test1").name,
    "gpu": r.dev_by_type(DeviceType.GPU).name,
    "igpu": r.dev_by_type("igpu").name,
    "cpu": r.dev_by_type(DeviceType.CPU).name,
    "best": r.init_best().device.name,
    "by_type": r.init_by_type("cpu").device.name,
    "by_name_dev": r.init_by_name("TEST1").device.name,
    "by_name_reg": r.init_by_name("test").device.name,
    "dups": {k: [d.name for d in v] for k, v in r.duplicate_device_ids().items()},
    "aliases": [d.name for d in r.device_aliases(r.dev_by_name("VARIANT0"))],
    "index": raised(r.dev_get, 9),
    "bad_type": raised(r.dev_by_type, "tpu"),
}
""",
    )
    assert out["reg_count"] == 3 and out["reg_get"] == "TEST" and out["reg_by_name"] == "VARIANT"
    assert out["no_reg"] is None
    assert out["dev_count"] == 4 and out["dev_get"] == "REENTRANT0"
    assert out["dev_by_name"] == "TEST1"
    assert (out["gpu"], out["igpu"], out["cpu"]) == ("VARIANT0", "TEST1", "TEST0")
    assert out["best"] == "VARIANT0"  # GPU before integrated GPU before CPU
    assert out["by_type"] == "TEST0" and out["by_name_dev"] == "TEST1"
    assert out["by_name_reg"] == "TEST0"
    assert out["dups"] == {"test-gpu-0": ["TEST1", "VARIANT0"]}
    assert out["aliases"] == ["TEST1"]
    assert out["index"]["type"] == "OutOfBoundsError" and "4 devices" in out["index"]["msg"]
    assert "unknown device type 'tpu'" in out["bad_type"]["msg"]


def test_init_best_falls_back_from_gpu_to_igpu_to_cpu(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
r.unload("VARIANT")
igpu = r.init_best().device.name
r.unload(r.reg_by_name("TEST"))
after = raised(r.init_best)
result = {"igpu": igpu, "none": after, "devices": [d.name for d in r.devices()]}
""",
    )
    assert out["igpu"] == "TEST1"
    assert out["devices"] == ["REENTRANT0"]  # an ACCEL device is never init_best's choice
    assert out["none"]["type"] == "BackendNotFoundError"
    assert "pip install -e plugins/cpu" in out["none"]["msg"]


def test_best_variant_failing_falls_back_to_the_next(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
result = {
    "variant": r.reg_by_name("VARIANT").features()["variant"],
    "fast": status("tp-variant-fast"),
    "basic": status("tp-variant-basic"),
}
""",
        TP_VARIANT_FAST_FAIL="1",
    )
    stderr = out.pop("_stderr")
    assert out == {"variant": "basic", "fast": "failed", "basic": "loaded"}
    assert "VARIANT (init: RuntimeError)" in stderr


def test_init_by_name_raises_the_recorded_failure(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
result = {
    "init": raised(r.init_by_name, "BrokenInit"),
    "import": raised(r.init_by_name, "broken_import"),
    "api": raised(r.init_by_name, "WRONGAPI"),
    "unsupported": raised(r.init_by_name, "FOOGPU"),
    "unsupported_device": raised(r.init_by_name, "FOOGPU0"),
    "missing": raised(r.init_by_name, "nothing"),
    "others_fine": r.init_by_name("TEST0").device.name,
}
""",
    )
    assert out["init"]["type"] == "PluginError" and out["init"]["cause"] == "RuntimeError"
    assert (
        "init_by_name('BrokenInit'): plugin 'BROKENINIT' from tp-broken-init 0.1.0"
        in (out["init"]["msg"])
    )
    assert out["import"]["cause"] == "ModuleNotFoundError"
    assert out["api"]["cause"] == "ApiVersionError"
    assert out["unsupported"]["type"] == "BackendUnavailableError"  # a BackendNotFoundError
    assert "cannot run here: no FooGPU driver found (tp-unsupported)" in out["unsupported"]["msg"]
    # a device name of a plugin that scored 0 gets the score's reason, not "pip install"
    assert "cannot run here: no FooGPU driver found" in out["unsupported_device"]["msg"]
    assert "pip install" not in out["unsupported_device"]["msg"]
    assert out["missing"]["type"] == "BackendNotFoundError"
    assert "Registered devices: REENTRANT0, TEST0, TEST1, VARIANT0" in out["missing"]["msg"]
    assert out["others_fine"] == "TEST0"


def test_backends_env_orders_restricts_and_sets_default(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
os.environ["TENSORPLUG_BACKENDS"] = "test, Variant"   # after import, before first use
first = {"regs": [x.name for x in r.regs()], "best": r.init_best().device.name,
         "reentrant": status("tp-reentrant"),
         "detail": [x.detail for x in r.plugin_records() if x.backend == "REENTRANT"][0],
         "import_failure_still_recorded": status("tp-broken-import")}
r.reset()
os.environ["TENSORPLUG_BACKENDS"] = "VARIANT,TEST"
second = {"regs": [x.name for x in r.regs()], "best": r.init_best().device.name}
result = {"first": first, "second": second}
""",
    )
    first, second = out["first"], out["second"]
    assert first["regs"] == ["TEST", "VARIANT"]
    assert first["best"] == "TEST1"  # the first listed backend, its best device
    assert first["reentrant"] == "disabled"
    assert first["detail"] == "not listed in TENSORPLUG_BACKENDS=test,Variant"
    assert first["import_failure_still_recorded"] == "failed"
    assert second == {"regs": ["VARIANT", "TEST"], "best": "VARIANT0"}


def test_requested_backend_failure_is_an_error_at_every_use(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
os.environ["TENSORPLUG_BACKENDS"] = "TEST,brokeninit"
result = {
    "load_all": raised(r.load_all),
    "again": raised(r.dev_count),
    "records": len(r.plugin_records()),
    "error": str(r.loading_error()),
}
r.reset()
os.environ["TENSORPLUG_BACKENDS"] = "TEST,notinstalled"
result["missing"] = raised(r.load_all)
r.reset()
os.environ["TENSORPLUG_BACKENDS"] = "TEST,FOOGPU"
result["unsupported"] = raised(r.load_all)
r.reset()
os.environ["TENSORPLUG_BACKENDS"] = "TEST,variant"
os.environ["TENSORPLUG_DISABLE"] = "variant"
result["disabled"] = raised(r.load_all)
""",
    )
    err = out["load_all"]
    assert err["type"] == "PluginError" and err["cause"] == "RuntimeError"
    assert err["msg"].startswith(
        "TENSORPLUG_BACKENDS asks for 'brokeninit', but plugin 'BROKENINIT' from tp-broken-init"
    )
    assert out["again"] == err and out["records"] == 10 and out["error"] == err["msg"]
    assert "no installed plugin provides a backend called 'notinstalled'" in out["missing"]["msg"]
    assert "tensorplug-notinstalled" not in out["missing"]["msg"]  # no invented package
    assert "cannot run here: no FooGPU driver found" in out["unsupported"]["msg"]
    assert "disabled by TENSORPLUG_DISABLE=variant" in out["disabled"]["msg"]


def test_disable_skips_backends_and_entry_points_without_importing(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
os.environ["TENSORPLUG_DISABLE"] = "variant,broken_import,BROKENINIT"
r.load_all()
recs = {x.distribution: x for x in r.plugin_records()}
result = {
    "regs": [x.name for x in r.regs()],
    "broken_import": [recs["tp-broken-import"].status.value, recs["tp-broken-import"].stage],
    "brokeninit": recs["tp-broken-init"].status.value,
    "fast_imported": "tp_variant_fast.backend" in sys.modules,
    "init_disabled": raised(r.init_by_name, "VARIANT"),
}
""",
    )
    assert out["regs"] == ["REENTRANT", "TEST"]
    assert out["broken_import"] == ["disabled", None]  # denied by entry-point name: not imported
    assert out["brokeninit"] == "disabled" and out["fast_imported"] is False
    assert out["init_disabled"]["type"] == "BackendUnavailableError"
    assert "disabled by TENSORPLUG_DISABLE" in out["init_disabled"]["msg"]


def test_strict_plugins_makes_any_failure_an_error(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
os.environ["TENSORPLUG_STRICT_PLUGINS"] = "1"
result = {"strict": raised(r.load_all)}
r.reset()
os.environ["TENSORPLUG_STRICT_PLUGINS"] = "maybe"
result["bad_value"] = raised(r.load_all)
""",
    )
    msg = out["strict"]["msg"]
    assert msg.startswith("5 plugin problems:")
    assert "- TENSORPLUG_STRICT_PLUGINS=1 and plugin 'BROKENINIT'" in msg
    assert out["strict"]["cause"] is not None
    assert out["bad_value"]["type"] == "SettingError"
    assert "TENSORPLUG_STRICT_PLUGINS='maybe'" in out["bad_value"]["msg"]


PATH_PLUGIN = """
from tensorplug.registration import Registration
from tensorplug.device import DeviceType

def _init():
    from tp_good.device import make_reg
    return make_reg("{name}", [("{name}0", DeviceType.CPU, None)], variant="path")

registration = Registration(name="{name}", api_version=(1, 0), init=_init, score={score})
"""


def _write_plugins(folder, **plugins: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for fname, text in plugins.items():
        (folder / f"{fname}.py").write_text(text)


def test_backend_path_adds_file_and_folder_plugins(plugin_env: PluginEnv, tmp_path) -> None:
    _write_plugins(
        tmp_path / "dir",
        pathplug=PATH_PLUGIN.format(name="PATHPLUG", score=1),
        variant99=PATH_PLUGIN.format(name="VARIANT", score=99),
        broken="raise ImportError('broken path plugin')\n",
        _helper="raise AssertionError('helpers starting with _ are not plugins')\n",
    )
    _write_plugins(tmp_path, single=PATH_PLUGIN.format(name="SINGLE", score=1))
    out = run(
        plugin_env,
        f"""
os.environ["TENSORPLUG_BACKEND_PATH"] = os.pathsep.join([{str(tmp_path / "dir")!r},
                                                          {str(tmp_path / "single.py")!r}])
result = {{
    "regs": [x.name for x in r.regs()],
    "variant": r.reg_by_name("VARIANT").features()["variant"],
    "fast": status("tp-variant-fast"),
    "broken": [[x.status.value, x.stage] for x in r.plugin_records()
               if x.spec.endswith("broken.py")],
}}
""",
    )
    assert out["regs"] == ["PATHPLUG", "REENTRANT", "SINGLE", "TEST", "VARIANT"]
    assert out["variant"] == "path" and out["fast"] == "not selected"  # 99 beats 20
    assert out["broken"] == [["failed", "import"]]


def test_load_one_plugin_by_entry_point_module_or_file(plugin_env: PluginEnv, tmp_path) -> None:
    _write_plugins(tmp_path, fileplug=PATH_PLUGIN.format(name="FILEPLUG", score=1))
    _write_plugins(tmp_path, nope=PATH_PLUGIN.format(name="NOPE", score=0))
    out = run(
        plugin_env,
        f"""
variant = r.load("variant")          # entry-point name: both variants compete
test = r.load("tp_good.registration:registration")
fileplug = r.load({str(tmp_path / "fileplug.py")!r})
loaded_before_first_use = r._state.loaded
result = {{
    "variant": variant.features()["variant"],
    "test": test.name,
    "file": fileplug.name,
    "lazy": loaded_before_first_use,
    "regs": [x.name for x in r.regs()],          # first use: load_all adds the rest
    "test_records": [x.status.value for x in r.plugin_records() if x.backend == "TEST"],
    "again": raised(r.load, "test"),
    "unknown": raised(r.load, "no_such_plugin"),
    "broken": raised(r.load, "brokeninit"),
    "zero": raised(r.load, {str(tmp_path / "nope.py")!r}),
    "missing_file": raised(r.load, {str(tmp_path / "missing.py")!r}),
}}
""",
    )
    assert out["variant"] == "fast" and out["test"] == "TEST" and out["file"] == "FILEPLUG"
    assert out["lazy"] is False
    assert out["regs"] == ["VARIANT", "TEST", "FILEPLUG", "REENTRANT"]
    assert out["test_records"] == ["loaded", "not selected"]
    assert "already registered" in out["again"]["msg"]
    assert "no installed plugin has an entry point named 'no_such_plugin'" in out["unknown"]["msg"]
    assert out["broken"]["type"] == "PluginError" and out["broken"]["cause"] == "RuntimeError"
    assert "cannot run here" in out["zero"]["msg"]
    assert out["missing_file"]["cause"] == "FileNotFoundError"


def test_load_all_from_path_isolates_failures(plugin_env: PluginEnv, tmp_path) -> None:
    _write_plugins(
        tmp_path,
        one=PATH_PLUGIN.format(name="ONE", score=1),
        two=PATH_PLUGIN.format(name="TWO", score=1),
        bad="registration = 42\n",
    )
    out = run(
        plugin_env,
        f"""
regs = r.load_all_from_path({str(tmp_path)!r})
bad = [x for x in r.plugin_records() if x.spec.endswith("bad.py")][0]
result = {{"loaded": [x.name for x in regs], "bad": bad.error_message(),
          "not_a_dir": raised(r.load_all_from_path, {str(tmp_path / "one.py")!r})}}
""",
    )
    assert out["loaded"] == ["ONE", "TWO"]
    assert "must name a tensorplug.registration.Registration" in out["bad"]
    assert "not a folder" in out["not_a_dir"]["msg"]


def test_unload_removes_backend_devices_and_hooks(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
hello = r.get_proc("VARIANT", "hello_from_test")()
r.unload("TEST")
result = {
    "hello": hello,
    "devices": [d.name for d in r.devices()],
    "dev": r.dev_by_name("TEST0"),
    "hook_gone": r.get_proc("VARIANT", "hello_from_test"),
    "status": status("tp-good"),
    "init": raised(r.init_by_name, "TEST"),
    "twice": raised(r.unload, "TEST"),
}
""",
    )
    assert out["hello"] == "hello from TEST to VARIANT"
    assert out["devices"] == ["REENTRANT0", "VARIANT0"] and out["dev"] is None
    assert out["hook_gone"] is None and out["status"] == "unloaded"
    assert "is unloaded: unload() was called" in out["init"]["msg"]
    assert out["twice"]["type"] == "BackendNotFoundError"


def test_hooks_get_proc_and_extra_buffer_types(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
result = {
    "own": r.get_proc("test", "test_features")(),
    "missing": r.get_proc("TEST", "nothing"),
    "extra_cpu": [b.name for b in r.extra_buffer_types(r.dev_by_name("TEST0"))],
    "extra_gpu": [b.name for b in r.extra_buffer_types(r.dev_by_name("VARIANT0"))],
    "unknown_reg": raised(r.get_proc, "NOPE", "x"),
}
""",
    )
    assert out["own"] == {"variant": "good"} and out["missing"] is None
    assert out["extra_cpu"] == ["TEST_REPACK"] and out["extra_gpu"] == []
    assert out["unknown_reg"]["type"] == "BackendNotFoundError"


def test_register_validates_programmatic_regs(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
from tp_good.device import TestReg, make_reg
class NewerReg(TestReg):
    api_version = (1, 7)
r.load_all()
result = {
    "ok": r.register(make_reg("CODE", [("CODE0", DeviceType.CPU, None)])).name,
    "newer": raised(r.register, make_reg("NEWER", [], reg_class=NewerReg)),
    "clash": raised(r.register, make_reg("OTHER", [("test0", DeviceType.CPU, None)])),
    "dup": raised(r.register, make_reg("code", [])),
    "not_reg": raised(r.register, object()),
}
result["devices"] = [d.name for d in r.devices()]
""",
    )
    assert out["ok"] == "CODE" and "CODE0" in out["devices"]
    assert out["newer"]["type"] == "ApiVersionError"
    assert "plugin API 1.7" in out["newer"]["msg"] and "upgrade tensorplug" in out["newer"]["msg"]
    assert "device named 'test0', but that name is already used" in out["clash"]["msg"]
    assert "already registered" in out["dup"]["msg"]
    assert out["not_reg"]["type"] in ("PluginError", "AttributeError")


def test_first_use_from_many_threads_loads_once(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
import threading
counts, barrier = [], threading.Barrier(8)
def worker():
    barrier.wait()
    counts.append(r.dev_count())
threads = [threading.Thread(target=worker) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
import tp_good.device
result = {"counts": counts, "inits": tp_good.device.INIT_CALLS}
""",
    )
    assert out["counts"] == [4] * 8 and out["inits"] == 1


def test_plugin_using_the_registry_while_loading(plugin_env: PluginEnv) -> None:
    out = run(
        plugin_env,
        """
os.environ["TENSORPLUG_BACKENDS"] = "VARIANT,REENTRANT"
result = r.reg_by_name("REENTRANT").features()
""",
    )
    # it ran after VARIANT: it saw the registry as loaded so far, without a second load
    assert out["devices_seen"] == "1" and out["gpu_seen"] == "VARIANT0"


# -- in-process unit tests (no plugins needed) ---------------------------------------------


def test_registration_validates_at_definition() -> None:
    with pytest.raises(ValueError, match="backend name such as 'CPU'"):
        Registration(name="two words", api_version=(1, 0), init="a:b")
    with pytest.raises(TypeError, match=r"api_version must be a \(major, minor\)"):
        Registration(name="X", api_version=1, init="a:b")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="init must be 'module:attr'"):
        Registration(name="X", api_version=(1, 0), init="a.b")
    with pytest.raises(TypeError, match="score must be an int"):
        Registration(name="X", api_version=(1, 0), init="a:b", score="high")  # type: ignore[arg-type]
    reg = Registration(name="X", api_version=(1, 0), init="a:b", score=lambda: (3, "why"))
    assert reg.evaluate_score() == (3, "why")
    assert Registration(name="X", api_version=(1, 0), init="a:b").evaluate_score() == (1, "")
    zero = Registration(name="X", api_version=(1, 0), init="a:b", score=0)
    assert zero.evaluate_score() == (0, "cannot run on this machine")
    with pytest.raises(TypeError, match="int >= 0"):
        Registration(name="X", api_version=(1, 0), init="a:b", score=lambda: -1).evaluate_score()


def test_api_version_rule_and_fixes() -> None:
    check_api_version((1, 0), plugin="p", package="tp-x")
    with pytest.raises(ApiVersionError) as e:
        check_api_version((0, 9), plugin="tp-x 0.3", package="tp-x")
    assert "tp-x 0.3 was built for tensorplug plugin API 0.9" in str(e.value)
    fix = "upgrade tp-x (pip install -U tp-x) to a release built for plugin API 1.x"
    assert fix in str(e.value)
    newer = (API_VERSION[0], API_VERSION[1] + 1)  # a minor the core does not know yet
    with pytest.raises(ApiVersionError, match=rf"API 1\.{newer[1]} or newer within 1\.x"):
        check_api_version(newer, plugin="p", package=None)
    assert issubclass(ApiVersionError, PluginError)


def test_settings_parse_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORPLUG_BACKENDS", " CUDA, cpu ,,cuda ")
    assert BACKENDS.get() == ("CUDA", "cpu")
    monkeypatch.setenv("TENSORPLUG_STRICT_PLUGINS", "off")
    assert STRICT_PLUGINS.get() is False
    monkeypatch.setenv("TENSORPLUG_STRICT_PLUGINS", "2")
    with pytest.raises(SettingError, match="TENSORPLUG_STRICT_PLUGINS='2'"):
        STRICT_PLUGINS.get()
    monkeypatch.delenv("TENSORPLUG_BACKENDS")
    assert BACKENDS.get() == ()


class _HookReg(Reg):
    """A Reg with no devices, for hook validation tests."""

    @property
    def name(self) -> str:
        return "HOOKS"

    def devices(self) -> list[Device]:
        return []


def test_hook_validation_reports_what_pluggy_would_ignore() -> None:
    pm = hooks.new_plugin_manager()

    class Unmarked(_HookReg):
        def tensorplug_get_proc(self, reg: Reg, name: str) -> None:
            return None

    with pytest.raises(PluginError, match="has a hook's name but no marker"):
        hooks.register_reg(pm, Unmarked())

    class WrongArgs(_HookReg):
        @hooks.hookimpl
        def tensorplug_get_proc(self, reg: Reg, name: str, flavour: str) -> None:
            return None

    with pytest.raises(PluginError, match=r"(?s)invalid hook implementation.*flavour"):
        hooks.register_reg(pm, WrongArgs())
    assert pm.get_plugins() == set()  # nothing half-registered

    class Helper:
        @hooks.hookimpl
        def tensorplug_extra_buffer_types(self, device: Device) -> None:
            return None

    class WithExtra(_HookReg):
        hookimpls = (Helper(),)

    names = hooks.register_reg(pm, WithExtra())
    assert names == ["reg:HOOKS:0"]
    hooks.unregister_reg(pm, names)
    assert pm.get_plugins() == set()
