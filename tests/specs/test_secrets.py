"""The secrets declaration: parsing, one source per name, never also in env, values read at submit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tsm.errors import InvalidAppError, InvalidRunOptionError, SecretError
from tsm.specs.api import Role
from tsm.specs.secrets import (
    MAX_VALUE,
    REDACTED,
    SecretRef,
    app_secrets,
    declared,
    option_entries,
    parse_secret,
    redact,
    resolve,
    source_variables,
)


@pytest.mark.parametrize(("text", "want"), [
    ("HF_TOKEN", SecretRef("HF_TOKEN", "env", "HF_TOKEN")),
    (" HF_TOKEN ", SecretRef("HF_TOKEN", "env", "HF_TOKEN")),
    ("HF_TOKEN:env:MY_TOKEN", SecretRef("HF_TOKEN", "env", "MY_TOKEN")),
    ("DB:file:~/.db pass", SecretRef("DB", "file", "~/.db pass")),
    ("DB:file:/a:b", SecretRef("DB", "file", "/a:b")),
    ("DB:k8s:db-creds/pass.word", SecretRef("DB", "k8s", "db-creds/pass.word")),
])
def test_an_entry_names_the_variable_and_where_its_value_is(text: str, want: SecretRef) -> None:
    ref = parse_secret(text)
    assert ref == want
    assert parse_secret(str(ref)) == ref


@pytest.mark.parametrize("text", [
    "", "1ABC", "A-B", "A B", "A=B", "A:", "A:vault:x", "A:env:", "A:env:1X", "A:file:", "A:k8s:Bad_Name/k",
    "A:k8s:name", "A:k8s:name/", "A:k8s:/key"
])
def test_a_malformed_entry_says_how_to_write_one(text: str) -> None:
    with pytest.raises(InvalidRunOptionError, match="secret"):
        parse_secret(text)


def test_a_name_declared_twice_with_two_sources_is_refused_and_the_same_twice_is_one() -> None:
    assert declared(["A", "A"], "role 'r'") == [SecretRef("A", "env", "A")]
    with pytest.raises(InvalidAppError, match="role 'r'.*A is declared twice"):
        declared(["A", "A:file:/x"], "role 'r'")
    with pytest.raises(InvalidAppError, match="role 'r'.*not a variable name"):
        declared(["no-dash"], "role 'r'")


def test_the_roles_of_an_app_share_one_source_per_name_and_keep_it_out_of_env() -> None:
    a = Role("a", entrypoint="x", secrets=["TOKEN"])
    b = Role("b", entrypoint="x", secrets=["TOKEN", "KEY:file:/k"])
    assert set(app_secrets([a, b])) == {"TOKEN", "KEY"}
    with pytest.raises(InvalidAppError, match="two sources in two roles"):
        app_secrets([a, Role("c", entrypoint="x", secrets=["TOKEN:env:OTHER"])])
    with pytest.raises(InvalidAppError, match="role 'd': TOKEN is both in env and a secret"):
        app_secrets([Role("d", entrypoint="x", env={"TOKEN": "v"}, secrets=["TOKEN"])])


def test_the_run_option_takes_a_list_or_one_comma_separated_string() -> None:
    assert option_entries(None) == []
    assert option_entries(["A", " B "]) == ["A", "B"]
    assert option_entries("A, B:file:/x,") == ["A", "B:file:/x"]
    with pytest.raises(InvalidRunOptionError, match="secrets"):
        option_entries(3)


def test_values_come_from_the_environment_and_files_byte_exact(tmp_path: Path) -> None:
    nasty = "a b'c\"$HOME`;\n\\x é\n"
    (tmp_path / "v").write_text(nasty + "\n")
    (tmp_path / "w").write_text("no newline")
    refs = [SecretRef("A", "env", "SRC"), SecretRef("B", "file", str(tmp_path / "v")),
            SecretRef("C", "file", str(tmp_path / "w")), SecretRef("D", "k8s", "s/k")]
    # one trailing newline (what an editor or `echo` adds) is dropped; every other byte stays
    assert resolve(refs, {"SRC": " x "}) == {"A": " x ", "B": nasty, "C": "no newline"}
    assert source_variables(refs) == {"SRC", "A", "B", "C", "D"}


def test_a_value_that_cannot_be_had_names_the_secret_and_where_it_looked_never_a_value(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match=r"secret A: \$SRC is not set.*A:file:PATH"):
        resolve([SecretRef("A", "env", "SRC")], {})
    with pytest.raises(SecretError, match="secret B: cannot read .*missing"):
        resolve([SecretRef("B", "file", str(tmp_path / "missing"))], {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SecretError, match="is empty"):
        resolve([SecretRef("B", "file", str(tmp_path / "empty"))], {})
    (tmp_path / "big").write_text("x" * (MAX_VALUE + 1))
    with pytest.raises(SecretError, match="over 64 KiB"):
        resolve([SecretRef("B", "file", str(tmp_path / "big"))], {})
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(SecretError, match="not UTF-8"):
        resolve([SecretRef("B", "file", str(tmp_path / "bin"))], {})
    with pytest.raises(SecretError, match=r"secret A: \$SRC is not UTF-8"):
        resolve([SecretRef("A", "env", "SRC")], {"SRC": b"\xff".decode(errors="surrogateescape")})
    with pytest.raises(SecretError) as e:
        resolve([SecretRef("A", "env", "SRC")], {"SRC": "bad\0value"})
    assert "bad" not in str(e.value)


def test_redact_hides_every_value_longest_first() -> None:
    assert redact("tok tok-long x", ["tok", "tok-long", ""]) == f"{REDACTED} {REDACTED} x"
