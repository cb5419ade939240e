"""``VLLM_PATCH_GUARD``: an unknown value refuses to start, naming it, instead of meaning warn (a mistyped
strict must not weaken the guard)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def guard(setup_module):
    import vllm_patch_guard

    return vllm_patch_guard


@pytest.mark.parametrize("value", ["stict", "STRICT!", "on", "1"])
def test_an_unknown_mode_refuses_to_start_naming_it(guard, monkeypatch, value):
    monkeypatch.setattr(guard, "diagnose", lambda: None)  # nothing wrong with vLLM: the mode alone refuses
    monkeypatch.delenv(guard.WARNED, raising=False)
    monkeypatch.setenv(guard.ENV, value)
    with pytest.raises(SystemExit) as exc:
        guard.check()
    message = str(exc.value)
    assert "\n" not in message and message.startswith("vllm-patch-guard: refusing to start")
    assert repr(value) in message or value in message
    assert "strict" in message and "warn" in message and "off" in message


@pytest.mark.parametrize("value", ["warn", "strict", "off", " Strict ", ""])
def test_the_known_modes_still_start_when_nothing_is_wrong(guard, monkeypatch, value):
    monkeypatch.setattr(guard, "diagnose", lambda: None)
    monkeypatch.setenv(guard.ENV, value)
    guard.check()
