"""The server's settings are one object: the command line fills it, create_app and run_server read it."""
from __future__ import annotations

import argparse

import pytest

from kvlab.http import server
from kvlab.serving import Engine
from kvlab.http.settings import ServerSettings


def options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_command_line_fills_every_setting(monkeypatch):
    monkeypatch.delenv("KVLAB_API_KEY", raising=False)
    got = ServerSettings.from_args(options("--retry-after", "3", "--max-body-bytes", "4096", "--read-timeout", "2.5",
                                           "--max-failed-steps", "5", "--step-timeout", "7", "--host", "0.0.0.0",
                                           "--port", "9001", "--log-level", "warning", "--drain-timeout", "4",
                                           "--api-key", "k"))
    assert got == ServerSettings(retry_after_s=3, api_key="k", max_body_bytes=4096, read_timeout_s=2.5,
                                 max_failed_steps=5, step_timeout_s=7.0, host="0.0.0.0", port=9001,
                                 log_level="warning", drain_timeout_s=4)
    defaults = ServerSettings.from_args(options())
    assert defaults == ServerSettings()  # the options' defaults are the settings' defaults


def test_create_app_reads_one_object_and_its_changes(model):
    app = server.create_app(Engine(model), "m", ServerSettings(max_failed_steps=2), api_key="secret", retry_after_s=5)
    state = app.state.kvlab
    assert state.settings == ServerSettings(max_failed_steps=2, api_key="secret", retry_after_s=5)
    assert (state.engine.max_failed_steps, state.api_key, state.retry_after_s) == (2, "secret", 5)


@pytest.mark.parametrize("change, message", [
    (dict(max_failed_steps=0), "max_failed_steps=0 must be an integer >= 1"),
    (dict(step_timeout_s=0), "step_timeout_s=0 must be > 0 seconds"),
    (dict(read_timeout_s=-1), "read_timeout_s=-1 must be > 0 seconds"),
    (dict(max_body_bytes=0), "max_body_bytes=0 must be > 0"),
])
def test_a_bad_setting_is_refused_with_its_name(change, message):
    with pytest.raises(ValueError, match=message):
        ServerSettings().replace(**change)


def test_an_unknown_setting_names_the_settings_there_are():
    with pytest.raises(TypeError, match=r"unknown server setting\(s\) \['max_waiting'\].*retry_after_s"):
        ServerSettings().replace(max_waiting=3)


def test_the_command_checks_its_settings_before_loading_a_model(monkeypatch):
    monkeypatch.setattr(server, "build_engine", lambda args: pytest.fail("the model was loaded before the check"))
    with pytest.raises(ValueError, match="max_failed_steps=0"):
        server.main(["--max-failed-steps", "0"])
