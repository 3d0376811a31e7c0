NUM_GPUS = 0
"""The job key an agent reads from a file: only a private file of this user is taken
(on one host its path comes through the unauthenticated rendezvous store)."""

import os

import pytest

from dynarl import ConfigError
from dynarl.launch.agent import read_secret_file

KEY = bytes(range(32))


def write(folder, mode=0o600, text=KEY.hex()):
    path = folder / "secret"
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_a_private_key_file_is_read(tmp_path):
    os.chmod(tmp_path, 0o700)
    assert read_secret_file(write(tmp_path), "DYNARL_SECRET_FILE") == KEY


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o602])
def test_a_key_file_others_may_access_is_refused(tmp_path, mode):
    os.chmod(tmp_path, 0o700)
    with pytest.raises(ConfigError, match="no access for group or others.*chmod 600"):
        read_secret_file(write(tmp_path, mode), "DYNARL_SECRET_FILE")


def test_a_key_file_in_a_folder_others_may_write_is_refused(tmp_path):
    os.chmod(tmp_path, 0o777)
    with pytest.raises(ConfigError, match="may be written by others"):
        read_secret_file(write(tmp_path), "DYNARL_SECRET_FILE")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_key_file_of_another_user_is_refused(tmp_path):
    """What another local user could point the store at: a file of theirs."""
    os.chmod(tmp_path, 0o700)
    path = write(tmp_path)
    os.chown(path, 12345, 12345)
    with pytest.raises(ConfigError, match="must be a regular file of uid 0"):
        read_secret_file(path, "dynarl/secret_path (from the store)")


def test_a_symlink_or_a_non_key_is_refused(tmp_path):
    os.chmod(tmp_path, 0o700)
    target = write(tmp_path)
    os.symlink(target, tmp_path / "link")
    with pytest.raises(ConfigError, match="cannot open"):
        read_secret_file(str(tmp_path / "link"), "DYNARL_SECRET_FILE")
    (tmp_path / "secret").unlink()
    with pytest.raises(ConfigError, match="does not hold a hex key"):
        read_secret_file(write(tmp_path, text="not hex"), "DYNARL_SECRET_FILE")
