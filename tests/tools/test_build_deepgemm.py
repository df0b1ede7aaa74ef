"""tools/build_deepgemm.py on the CPU: the pin's shape, refusals (digest mismatch, no archive, an
archive that escapes its folder, a build inside the source tree) and the environment it hands
out. The build itself runs on the GPU machine (./dev gpu-test, bench/gpu_run.sh), where the
DeepGEMM tests then run against the library it built."""

import io
import tarfile

import pytest

from tools import build_deepgemm as bd
from tools import toolchains as tcmod


def test_the_pin_is_complete():
    src = bd.pin()
    assert len(src["commit"]) == 40 and len(src["sha256"]) == 64 and src["archive"].endswith(".tar.gz")
    assert src["version"] == "2.6.1"


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_digest_mismatch_is_refused(tmp_path, capsys):
    bad = _tar(tmp_path / "deepgemm.tar.gz", [("deepgemm-x/develop.sh", b"echo hacked\n")])
    assert bd.main(["--archive", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"sha256 {bd.sha256(bad)} does not match the pin {bd.pin()['sha256']}" in err
    assert not (tmp_path / "out").exists()  # nothing unpacked, nothing built


def test_missing_archive_names_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(bd.ARCHIVE_ENV, str(tmp_path / "nope.tar.gz"))
    assert bd.find_archive(bd.pin(), root=tmp_path / "repo") is None
    assert bd.main(["--archive", str(tmp_path / "absent.tar.gz")]) == 2
    assert f"no DeepGEMM source archive {bd.pin()['archive']} found (looked at: {tmp_path / 'absent.tar.gz'})" \
        in capsys.readouterr().err


def test_unpack_refuses_escaping_members(tmp_path):
    bad = _tar(tmp_path / "a.tar.gz", [("top/ok.txt", b"x"), ("../evil.txt", b"y")])
    with pytest.raises(bd.BuildError, match="one top-level folder|outside"):
        bd.unpack(bad, tmp_path / "dest")
    bad2 = _tar(tmp_path / "b.tar.gz", [("top/../../evil.txt", b"y")])
    with pytest.raises(tarfile.FilterError):  # tarfile's data filter: a member outside the destination
        bd.unpack(bad2, tmp_path / "dest2")
    assert not (tmp_path / "evil.txt").exists()
    good = _tar(tmp_path / "c.tar.gz", [("top/develop.sh", b"true\n")])
    assert bd.unpack(good, tmp_path / "dest3") == tmp_path / "dest3" / "top"


def test_build_inside_the_source_tree_is_refused(tmp_path):
    src = bd.pin()
    with pytest.raises(bd.BuildError, match="inside the source tree"):
        bd.build(None, tmp_path, bd.ROOT / "build" / "dg", src)


def test_environment_prepends():
    env = bd.apply_env({"PYTHONPATH": "/dg/src", "DG_JIT_CACHE_DIR": "/dg/jit", "LD_PRELOAD": "/lib/a.so"},
                       {"PYTHONPATH": "/repo", "LD_PRELOAD": "/lib/b.so", "HOME": "/h"})
    assert env == {"PYTHONPATH": "/dg/src:/repo", "DG_JIT_CACHE_DIR": "/dg/jit", "LD_PRELOAD": "/lib/a.so /lib/b.so",
                   "HOME": "/h"}
    assert bd.use_env(bd.pathlib.Path("/x"))["PYTHONPATH"] == "/x/src"


@pytest.mark.parametrize("key,value,msg", [
    ("commit", "54e2261", "must be a full 40-hex commit"),
    ("sha256", "abc", "must be 64 lowercase hex"),
    ("version", "2.1.0", "older than min_version"),
    ("archive", "../x.tar.gz", "must be a bare file name"),
])
def test_toolchains_refuses_a_bad_source_pin(tmp_path, key, value, msg):
    text = (tcmod.REPO_ROOT / tcmod.TOOLCHAINS_TOML).read_text()
    src = bd.pin()
    text = text.replace(f'{key} = "{src[key]}"', f'{key} = "{value}"', 1)
    (tmp_path / "deps").mkdir()
    (tmp_path / tcmod.TOOLCHAINS_TOML).write_text(text)
    with pytest.raises(tcmod.ToolchainError, match=msg):
        tcmod.load(tmp_path)
