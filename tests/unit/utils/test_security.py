"""The job's API key helpers: which key a job uses, the bearer check, redaction of command lines and
the folder allow-list (symlinks and `..` cannot lead out of it)."""

import os

from slime.utils.security import (API_KEY_ENV, REDACTED, auth_headers, bearer_matches, ensure_job_api_key,
                                  job_api_key, path_within, redact_argv)


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
    argparse's code 2 at start-up: generated keys are hex, and the router gets `--api-key=KEY`."""
    from slime.backends.sglang_utils.router import router_command

    for _ in range(500):
        monkeypatch.setenv(API_KEY_ENV, "")  # empty reads as unset; teardown restores the original
        assert not ensure_job_api_key().startswith("-")
    assert "--api-key=-leading-dash" in router_command("127.0.0.1", 1, api_key="-leading-dash")
