"""An operator's audit of the service: what a client is told when an archive entry cannot be written (never the
server's paths)."""

from __future__ import annotations

import pytest

from zoomer_ar.service.archives import ArchiveError, safe_extract

from service_testutil import tar_gz, zip_bytes


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_an_entry_name_the_filesystem_refuses_is_400_without_the_servers_paths(tmp_path, kind):
    name = "pkg/" + "a" * 300 + ".py"  # under the 1024-character cap, over the filesystem's 255 bytes per name
    data = tar_gz({name: b"x = 1\n"}) if kind == "tar" else zip_bytes({name: b"x = 1\n"})
    arc = tmp_path / "src.bin"
    arc.write_bytes(data)
    dest = tmp_path / "server-data" / "jobs" / "j1" / "input" / "source"
    with pytest.raises(ArchiveError) as info:
        safe_extract(arc, dest, what="source archive")
    msg = str(info.value)
    assert msg.startswith("source archive: entry 'pkg/aaa"), msg
    assert "cannot be written" in msg and "File name too long" in msg, msg
    assert str(tmp_path) not in msg and "server-data" not in msg, msg
    assert not dest.exists()
