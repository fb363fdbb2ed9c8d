"""Settings parsing: defaults, camelCase, per-setting fallback with messages."""

from __future__ import annotations

from kode.backends.base import SpeculationMethod
from kode.completion.settings import DEFAULT, BackendKind, RemoteApi, parse


def test_none_gives_defaults() -> None:
    assert parse(None) == (DEFAULT, [])


def test_camel_case_values_apply() -> None:
    settings, problems = parse(
        {"maxTokens": 64, "speculation": "ngram", "remote": {"url": "http://h:1", "api": "openai"}}
    )
    assert problems == []
    assert settings.max_tokens == 64
    assert settings.speculation is SpeculationMethod.NGRAM
    assert settings.remote.url == "http://h:1" and settings.remote.api is RemoteApi.OPENAI


def test_wrapped_in_kode_section() -> None:
    settings, _ = parse({"kode": {"backend": "auto"}})
    assert settings.backend is BackendKind.AUTO


def test_a_bad_setting_falls_back_alone_and_is_reported() -> None:
    settings, problems = parse(
        {"maxTokens": 0, "speculation": "warp", "model": "small", "bogus": 1, "remote": {"api": 3}}
    )
    assert settings.model == "small"  # the good one still applies
    assert settings.max_tokens == DEFAULT.max_tokens
    assert settings.speculation is DEFAULT.speculation
    joined = "\n".join(problems)
    for name in ("maxTokens", "speculation", "bogus: unknown setting", "remote.api"):
        assert name in joined
    assert len(problems) == 4


def test_not_an_object() -> None:
    settings, problems = parse([1, 2])
    assert settings == DEFAULT and problems == ["settings must be an object, got list"]


def test_settings_are_frozen() -> None:
    settings, _ = parse({})
    try:
        settings.max_tokens = 5  # type: ignore[misc]
    except AttributeError:
        return
    raise AssertionError("Settings must be immutable")


def test_messages_name_the_setting_and_what_it_accepts() -> None:
    _, problems = parse(
        {"speculation": "warp", "maxTokens": "many", "remote": {"timeoutMs": 0, "x": 1}}
    )
    assert problems == [
        "speculation: 'warp' is not one of auto, none, ngram, lookahead, draft, remote; "
        "using the default",
        "maxTokens: Expected `int`, got `str`; using the default",
        "remote.timeoutMs: Expected `int` >= 1; using the default",
        "remote.x: unknown setting, ignored",
    ]
    settings, problems = parse({"remote": "http://h:1"})
    assert settings.remote == DEFAULT.remote
    assert problems == ["remote: must be an object, got str; using the default"]


def test_docstring_example() -> None:
    import doctest

    from kode.completion import settings

    result = doctest.testmod(settings)
    assert result.attempted > 0 and result.failed == 0
