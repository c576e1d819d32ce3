"""Archive safety (zoomer_ar.service.archives) and streamed multipart parsing (uploads), without a server."""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from zoomer_ar.service.archives import ArchiveError, ArchiveLimits, check_name, safe_extract, single_root
from zoomer_ar.service.uploads import MultipartReceiver, UploadError, prepare_inputs, safe_filename

from service_testutil import tar_gz, zip_bomb, zip_bytes

SMALL = ArchiveLimits(max_bytes=8 << 20, max_entries=50, max_ratio=100.0, ratio_floor=1 << 20)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _refused(tmp_path: Path, data: bytes, needle: str, limits: ArchiveLimits = SMALL) -> str:
    arc = _write(tmp_path, "a.bin", data)
    dest = tmp_path / "out"
    with pytest.raises(ArchiveError) as info:
        safe_extract(arc, dest, limits, what="source archive")
    msg = str(info.value)
    assert needle in msg, msg
    assert msg.startswith("source archive: ")
    assert not dest.exists(), "a refused archive leaves nothing behind"
    return msg


def test_benign_tar_and_zip_extract(tmp_path):
    entries = {"pkg/train.py": b"print(1)\n", "pkg/data/cfg.yaml": b"a: 1\n", "README": b"x"}
    for i, data in enumerate((tar_gz(entries), zip_bytes(entries))):
        dest = tmp_path / f"out{i}"
        stats = safe_extract(_write(tmp_path, f"a{i}", data), dest, SMALL)
        assert stats.files == 3
        assert (dest / "pkg" / "train.py").read_bytes() == b"print(1)\n"
        assert oct((dest / "pkg" / "train.py").stat().st_mode & 0o777) == oct(0o644)


def test_single_root(tmp_path):
    safe_extract(_write(tmp_path, "a.tgz", tar_gz({"proj/a.py": b"1", "proj/b/c.py": b"2"})), tmp_path / "o", SMALL)
    assert single_root(tmp_path / "o") == tmp_path / "o" / "proj"
    safe_extract(_write(tmp_path, "b.tgz", tar_gz({"a.py": b"1", "b/c.py": b"2"})), tmp_path / "p", SMALL)
    assert single_root(tmp_path / "p") == tmp_path / "p"


@pytest.mark.parametrize("name", ["/etc/evil.py", "C:\\evil.py", "\\\\host\\share\\evil.py", "C:/evil.py"])
def test_absolute_names_refused(tmp_path, name):
    _refused(tmp_path, tar_gz({name: b"x"}), "absolute path")
    _refused(tmp_path, zip_bytes({name: b"x"}), "absolute path")


@pytest.mark.parametrize("name", ["../evil.py", "a/../../evil.py", "a/..", "..\\evil.py"])
def test_dotdot_refused(tmp_path, name):
    _refused(tmp_path, tar_gz({name: b"x"}), "'..'")
    _refused(tmp_path, zip_bytes({name: b"x"}), "'..'")
    assert not (tmp_path.parent / "evil.py").exists()


def test_links_refused(tmp_path):
    _refused(tmp_path, tar_gz({"a.py": b"1"}, links={"link.py": ("sym", "/etc/passwd")}), "symbolic link")
    _refused(tmp_path, tar_gz({"a.py": b"1"}, links={"hard.py": ("hard", "a.py")}), "hard link")
    _refused(tmp_path, zip_bytes({"a.py": b"1"}, symlinks={"link.py": "/etc/passwd"}), "symbolic link")


def test_symlink_then_write_through_refused_before_anything_is_written(tmp_path):
    # the classic: a link to outside, then a file "through" it; refused at the link
    data = tar_gz({}, links={"escape": ("sym", str(tmp_path / "victim"))})
    buf = io.BytesIO(gzip.decompress(data))
    _refused(tmp_path, data, "symbolic link")
    assert not (tmp_path / "victim").exists()
    assert buf.getbuffer().nbytes > 0


def test_special_files_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("fifo")
        info.type = tarfile.FIFOTYPE
        tf.addfile(info)
    _refused(tmp_path, buf.getvalue(), "special file")


def test_zip_bomb_refused_by_ratio(tmp_path):
    msg = _refused(tmp_path, zip_bomb(16 << 20), "decompression bomb",
                   ArchiveLimits(max_bytes=1 << 30, max_entries=50, max_ratio=100.0, ratio_floor=1 << 20))
    assert "ratio" in msg


def test_zip_bomb_refused_by_size(tmp_path):
    msg = _refused(tmp_path, zip_bomb(16 << 20), "decompression bomb",
                   ArchiveLimits(max_bytes=8 << 20, max_entries=50, max_ratio=1e9))
    assert "uncompressed size exceeds" in msg


def test_gzip_tar_bomb_refused_before_inflating(tmp_path):
    # a 64 MiB tar entry of zeros: refused at its header, whatever the ratio cap
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tf:
        info = tarfile.TarInfo("zeros.py")
        info.size = 64 << 20
        tf.addfile(info, io.BytesIO(b"\0" * info.size))
    assert len(buf.getvalue()) < 200_000
    _refused(tmp_path, buf.getvalue(), "uncompressed size exceeds", ArchiveLimits(max_bytes=8 << 20, max_ratio=1e9))
    _refused(tmp_path, buf.getvalue(), "compression ratio", ArchiveLimits(max_bytes=1 << 30, max_ratio=100))


def test_too_many_entries(tmp_path):
    _refused(tmp_path, tar_gz({f"f{i}.py": b"x" for i in range(60)}), "more than 50 entries")
    _refused(tmp_path, zip_bytes({f"f{i}.py": b"x" for i in range(60)}), "more than 50 entries")


def test_encrypted_and_garbage_refused(tmp_path):
    data = bytearray(zip_bytes({"a.py": b"print(1)"}))
    # set the encryption flag in the central directory entry
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 8] |= 0x1
    _refused(tmp_path, bytes(data), "encrypted")
    _refused(tmp_path, b"not an archive at all", "not a .tar.gz")
    _refused(tmp_path, b"\x1f\x8b" + b"garbage" * 10, "not a readable tar archive")
    _refused(tmp_path, b"PK\x03\x04" + b"garbage" * 10, "not a readable zip archive")


def test_file_and_folder_clash(tmp_path):
    _refused(tmp_path, zip_bytes({"a": b"1", "a/b.py": b"2"}), "both")


def test_check_name():
    assert check_name("./a/./b.py", "x").as_posix() == "a/b.py"
    assert check_name("./", "x") is None
    with pytest.raises(ArchiveError):
        check_name("a\x00b", "x")
    with pytest.raises(ArchiveError):
        check_name("a/" * 600, "x")


# --- multipart -------------------------------------------------------------------------------------------


def _multipart(parts: list[tuple[str, str | None, bytes]], boundary: str = "XyZ") -> tuple[str, bytes]:
    out = io.BytesIO()
    for name, filename, data in parts:
        out.write(f"--{boundary}\r\n".encode())
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out.write(f"Content-Disposition: {disp}\r\n\r\n".encode())
        out.write(data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", out.getvalue()


def _feed(tmp_path, ctype, body, chunk=7):
    r = MultipartReceiver(ctype, tmp_path / "upload")
    for i in range(0, len(body), chunk):
        r.feed(body[i:i + chunk])
    return r.finish()


def test_multipart_streams_files_to_disk(tmp_path):
    blob = bytes(range(256)) * 1000
    ctype, body = _multipart([("trace", "../../t.json.gz", blob), ("job", None, b"resnet"), ("gpus", None, b"8")])
    files, fields = _feed(tmp_path, ctype, body, chunk=4096)
    assert files["trace"].path == tmp_path / "upload" / "trace"
    assert files["trace"].path.read_bytes() == blob and files["trace"].size == len(blob)
    assert fields == {"job": "resnet", "gpus": "8"}
    assert safe_filename(files["trace"].filename, "x") == "t.json.gz"


@pytest.mark.parametrize("parts,needle", [
    ([("evil", None, b"1")], "unknown form field"),
    ([("job", None, b"a"), ("job", None, b"b")], "given twice"),
    ([("job", None, b"x" * (65 << 10))], "longer than"),
    ([("job", None, b"\xff\xfe")], "not UTF-8"),
])
def test_multipart_refusals(tmp_path, parts, needle):
    ctype, body = _multipart(parts)
    with pytest.raises(UploadError, match=needle):
        _feed(tmp_path, ctype, body, chunk=1 << 20)


def test_multipart_truncated_and_wrong_type(tmp_path):
    ctype, body = _multipart([("trace", "t.json", b"{}")])
    with pytest.raises(UploadError, match="incomplete"):
        _feed(tmp_path, ctype, body[:-20])
    with pytest.raises(UploadError, match="multipart/form-data"):
        MultipartReceiver("application/json", tmp_path)
    with pytest.raises(UploadError, match="boundary"):
        MultipartReceiver("multipart/form-data", tmp_path)


def test_prepare_inputs(tmp_path):
    up = tmp_path / "job" / "upload"
    ctype, body = _multipart([("ranks", "run7.zip", zip_bytes({"rank-0.json": b"{}", "rank-1.json": b"{}"})),
                              ("source", "src.tgz", tar_gz({"train.py": b"x = 1\n"}))])
    files, _ = _feed(tmp_path / "job", ctype, body, chunk=1 << 16)
    assert up.is_dir()
    params = prepare_inputs(tmp_path / "job", files, SMALL)
    assert params["input"] == "ranks" and params["path"] == "ranks" and params["default_name"] == "run7"
    assert params["source"] == "source"
    assert (tmp_path / "job" / "input" / "source" / "train.py").is_file()
    assert not up.exists()


@pytest.mark.parametrize("parts,needle", [
    ([], "is required"),
    ([("trace", "a.json", b"{}"), ("ranks", "r.zip", b"PK")], "not both"),
    ([("trace", "a.json", b"")], "empty"),
    ([("ranks", "r.zip", None)], "no trace files"),
    ([("trace", "a.json", b"{}"), ("source", "s.zip", None)], "no Python"),
])
def test_prepare_inputs_refusals(tmp_path, parts, needle):
    parts = [(n, f, d if d is not None else zip_bytes({"notes.txt": b"hello"})) for n, f, d in parts]
    ctype, body = _multipart(parts or [("job", None, b"x")])
    files, _ = _feed(tmp_path, ctype, body, chunk=1 << 16)
    with pytest.raises((UploadError, ArchiveError), match=needle):
        prepare_inputs(tmp_path, files, SMALL)


def test_trace_without_suffix_is_named_by_content(tmp_path):
    ctype, body = _multipart([("trace", "blob", gzip.compress(b"{}"))])
    files, _ = _feed(tmp_path, ctype, body, chunk=1 << 16)
    params = prepare_inputs(tmp_path, files, SMALL)
    assert params["path"] == "trace/trace.json.gz"
    assert zipfile.is_zipfile(io.BytesIO(zip_bytes({"a": b"b"})))
