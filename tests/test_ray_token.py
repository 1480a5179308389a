"""A sweep's private local Ray instance leaves nothing in the user's home folder."""

from __future__ import annotations

import pytest

from memcores.experiments.tune_engine import connect_ray

ray = pytest.importorskip("ray")
# Ray's start-up alone takes 20 s to minutes on a busy 2-core machine: run with `-m slow`.
pytestmark = pytest.mark.slow

TOKEN_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def test_a_local_instance_is_authenticated_without_writing_a_token_file(tmp_path, monkeypatch):
    for name in TOKEN_VARIABLES:  # set, then deleted: the test's end restores them as they were
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # Ray writes its token to ~/.ray/auth_token
    if ray.is_initialized():
        ray.shutdown()
    assert connect_ray(None, cpus=1)
    try:
        assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42
    finally:
        ray.shutdown()
    assert not (tmp_path / ".ray").exists()
