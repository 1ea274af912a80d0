"""The job's API key helpers: which key a job uses, the bearer check, redaction of command lines and
the folder allow-list (symlinks and `..` cannot lead out of it)."""

import os

import pytest

from slime.utils.security import (API_KEY_ENV, REDACTED, auth_headers, bearer_matches, ensure_job_api_key,
                                  job_api_key, path_within, redact_argv, secret_flags_in)


def test_job_key_comes_from_the_environment_else_the_flag_else_a_fresh_one(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "")  # empty reads as unset; recorded, so the key set below does not leak
    assert job_api_key() is None and auth_headers(None) == {}
    fresh = ensure_job_api_key()
    assert len(fresh) >= 32 and os.environ[API_KEY_ENV] == fresh == job_api_key()
    assert ensure_job_api_key("from-flag") == fresh  # a key already set wins (the whole job shares it)
    monkeypatch.delenv(API_KEY_ENV)
    assert ensure_job_api_key("from-flag") == "from-flag" and auth_headers("k") == {"Authorization": "Bearer k"}
    monkeypatch.delenv(API_KEY_ENV)
    assert ensure_job_api_key() != fresh


def test_bearer_check_follows_sglang():
    assert bearer_matches("Bearer k1", "k1") and bearer_matches("bearer k1", "k1")
    for header in (None, "", "k1", "Bearer k2", "Basic k1", "Bearer  k1", "Bearer k1 "):
        assert not bearer_matches(header, "k1"), header


def test_secret_flag_values_are_redacted_in_both_spellings():
    argv = ["python", "-m", "x", "--api-key", "s1", "--port", "1", "--wandb-key=s2", "--api-key"]
    assert redact_argv(argv) == ["python", "-m", "x", "--api-key", REDACTED, "--port", "1",
                                 f"--wandb-key={REDACTED}", "--api-key"]


def test_path_allow_list_resolves_links_and_dots(tmp_path):
    job, outside = tmp_path / "job", tmp_path / "outside"
    (job / "ckpt").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, job / "escape")
    assert path_within(job, [job]) and path_within(job / "ckpt", [job]) and path_within(job / "new", [job])
    for path in (outside, job / "escape", job / ".." / "outside", tmp_path / "job-other"):
        assert not path_within(path, [job]), path
    assert not path_within(job, [])


def test_generated_keys_never_read_as_a_flag(monkeypatch):
    """A key starting with '-' (secrets.token_urlsafe gives one in 64) made sglang-router exit with
    argparse's code 2 at start-up: generated keys are hex, and the router reads the key from its
    environment (router_main), where any key is only a key."""
    pytest.importorskip("sglang_router")
    from slime.backends.sglang_utils.router_main import keyed_router_args

    for _ in range(500):
        monkeypatch.setenv(API_KEY_ENV, "")  # empty reads as unset; teardown restores the original
        assert not ensure_job_api_key().startswith("-")
    argv = ["--host", "127.0.0.1", "--port", "1"]
    assert keyed_router_args(argv, environ={API_KEY_ENV: "-leading-dash"}).api_key == "-leading-dash"


def test_launchers_refuse_the_key_on_their_command_line():
    """sglang_main and router_main take the key by environment only; a credential flag on their
    own argv (readable by every local user) stops them."""
    pytest.importorskip("sglang_router")
    from slime.backends.sglang_utils.router_main import keyed_router_args
    from slime.backends.sglang_utils.sglang_main import keyed_server_args

    assert secret_flags_in(["--port", "1", "--api-key=k", "--wandb-key", "w"]) == ["--api-key", "--wandb-key"]
    for launcher in (keyed_router_args, lambda argv, environ: keyed_server_args(argv, environ, prepare=list)):
        with pytest.raises(SystemExit, match="--api-key on a command line"):
            launcher(["--host", "127.0.0.1", "--api-key", "k"], environ={})


def test_router_gets_no_key_on_its_command_line_and_one_origin():
    pytest.importorskip("sglang_router")
    from slime.backends.sglang_utils.router import router_command
    from slime.backends.sglang_utils.router_main import keyed_router_args

    command = router_command("127.0.0.1", 30000)
    assert not secret_flags_in(command)
    router_args = keyed_router_args(command[3:], environ={API_KEY_ENV: "k"})
    assert router_args.api_key == "k" and router_args.cors_allowed_origins == ["http://127.0.0.1:30000"]
    assert keyed_router_args(command[3:], environ={}).api_key is None
