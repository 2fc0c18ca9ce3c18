"""``tsm.specs.overlays``: TorchX's nightly overlays (PUT/JOIN/DEL patches of a scheduler's request)."""

from __future__ import annotations

from typing import Any

import pytest

from tsm.specs import AppDef, Role
from tsm.specs.overlays import DEL, JOIN, PUT, apply_overlay, get_overlay, set_overlay, validate_overlay


def test_default_rules_dicts_merge_lists_append_scalars_replace() -> None:
    base: dict[str, Any] = {"spec": {"cpu": "500m"}, "tags": ["prod"], "replicas": 1}
    apply_overlay(base, {"spec": {"memory": "1Gi"}, "tags": ["gpu"], "replicas": 3, "new": [1]})
    assert base == {"spec": {"cpu": "500m", "memory": "1Gi"}, "tags": ["prod", "gpu"], "replicas": 3, "new": [1]}
    apply_overlay(base, {"tags": ("only",)})  # a tuple replaces (TorchX's older PUT)
    assert base["tags"] == ["only"]
    with pytest.raises(TypeError, match="type mismatch for attr: `tags`"):
        apply_overlay(base, {"tags": "x"})


def test_put_join_del_operators() -> None:
    base: dict[str, Any] = {"containers": [{"name": "main", "image": "v1"}], "keep": 1, "remove": "old", "n": None}
    apply_overlay(base, {JOIN("containers", on="name"): [{"name": "main", "memory": "1Gi"}, {"name": "side", "image": "p"}]})
    assert base["containers"] == [{"name": "main", "image": "v1", "memory": "1Gi"}, {"name": "side", "image": "p"}]
    apply_overlay(base, {PUT("containers"): [{"name": "only"}], DEL("remove"): None, "n": 5})
    assert base == {"containers": [{"name": "only"}], "keep": 1, "n": 5}
    with pytest.raises(TypeError, match="JOIN"):
        apply_overlay({"c": ["x"]}, {JOIN("c", on="name"): [{"name": "a"}]})


def test_set_overlay_accumulates_and_keeps_operators_until_applied() -> None:
    role = Role("trainer", image="img", entrypoint="train.py")
    set_overlay(role, "kubernetes", "V1Pod", {"spec": {"nodeSelector": {"accelerator": "a100"}}})
    set_overlay(role, "kubernetes", "V1Pod", {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}})
    set_overlay(role, "kubernetes", "V1Pod", {"spec": {PUT("containers"): [{"name": "only"}]}, DEL("hostNetwork"): None})
    overlay = get_overlay(role, "kubernetes", "V1Pod")
    assert overlay["spec"]["nodeSelector"] == {"accelerator": "a100"} and PUT("containers") in overlay["spec"]
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}, "hostNetwork": True}
    apply_overlay(pod, overlay)
    assert pod == {"spec": {"containers": [{"name": "only"}], "nodeSelector": {"accelerator": "a100"},
                            "tolerations": [{"key": "gpu", "operator": "Exists"}]}}
    assert get_overlay(AppDef("a"), "kubernetes", "V1Pod") == {}


def test_flat_form_and_validation() -> None:
    role = Role("r", metadata={"kubernetes": {"nodeSelector": {"a": "b"}}})
    assert get_overlay(role, "kubernetes", "V1Pod") == {"nodeSelector": {"a": "b"}}
    with pytest.raises(ValueError, match="`PodSpec.env`"):
        validate_overlay({PUT("env"): {}, "nodeSelector": {}}, blocklist=["env"], overlay_name="PodSpec")
    with pytest.raises(ValueError, match="misplaced keys.*use V1Pod"):
        validate_overlay({"spec": {}}, forbidden_keys={"spec"}, suggestion="use V1Pod")
