"""TorchX nightly's ``StructuredOpts`` (``torchx.schedulers.api``): run options as a dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tsm.compat.torchx.schedulers.api import StructuredOpts
from tsm.errors import InvalidRunOptionError


@dataclass
class K8sOpts(StructuredOpts):
    context: str = "default"
    """The kube context."""


@dataclass
class SampleOpts(StructuredOpts):
    cluster_name: str
    """Name of the cluster."""

    num_retries: int = 3
    """Number of retry attempts."""

    optional_tag: str | None = None
    """Optional tag for the job."""

    mail_user: str | None = field(default=None, metadata={"cfg_key": "mail-user"})
    """Who gets mail."""

    k8s: K8sOpts = field(default_factory=K8sOpts)


def test_as_runopts_declares_each_field_with_its_docstring() -> None:
    opts = SampleOpts.as_runopts()
    assert [k for k, _ in opts] == ["cluster_name", "num_retries", "optional_tag", "mail-user", "k8s.context"]
    name, retries = opts.get("cluster_name"), opts.get("num_retries")
    assert name is not None and name.is_required and name.help == "Name of the cluster."
    assert retries is not None and (retries.default, retries.is_required) == (3, False)
    assert opts.resolve({"cluster_name": "c"})["num_retries"] == 3


def test_from_cfg_reads_snake_camel_cfg_keys_and_nested_groups() -> None:
    opts = SampleOpts.from_cfg({"clusterName": "c1", "num_retries": 5, "mail-user": "me", "k8s.context": "prod",
                                "other_scheduler_opt": 1})
    assert (opts.cluster_name, opts.num_retries, opts.mail_user, opts.k8s.context) == ("c1", 5, "me", "prod")
    assert opts["clusterName"] == "c1" and opts["k8s.context"] == "prod" and opts["other_scheduler_opt"] == 1
    assert "mail-user" in opts and "nope" not in opts and len(opts) == 6
    with pytest.raises(KeyError):
        opts["nope"]


def test_two_spellings_with_different_values_are_refused() -> None:
    assert SampleOpts.from_cfg({"cluster_name": "a", "clusterName": "a"}).cluster_name == "a"
    with pytest.raises(InvalidRunOptionError, match="passed under two spellings"):
        SampleOpts.from_cfg({"cluster_name": "a", "clusterName": "b"})


def test_or_merges_into_a_dict() -> None:
    merged = SampleOpts(cluster_name="x") | K8sOpts(context="y")
    assert merged["cluster_name"] == "x" and merged["context"] == "y" and merged["k8s.context"] == "default"
