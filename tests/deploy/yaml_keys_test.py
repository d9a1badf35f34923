#!/usr/bin/python3
"""Every YAML file the project ships parses, and no mapping repeats a key.

A repeated key is invalid YAML that many parsers take silently (the last
one wins), so a CRD property written twice, or an alert with two `expr`,
would pass every other check. Files: the CRD (the chart's crds/ links to
it), the chart's values and Chart.yaml, the examples, the alert rules and
their promtool tests. Helm templates are not YAML until rendered and are
left to helm lint.

usage: yaml_keys_test.py SOURCE_DIR
"""
import glob
import os
import sys

import yaml


class StrictLoader(yaml.SafeLoader):
    pass


def _mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"key {key!r} repeated (first at line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def main():
    root = sys.argv[1]
    patterns = ["crds/*.yaml", "helm/tandem/values.yaml", "helm/tandem/Chart.yaml", "examples/*.yaml",
                "examples/**/*.yaml", "dashboards/*.yaml", "tests/dashboards/*.yaml"]
    files = sorted({f for p in patterns for f in glob.glob(os.path.join(root, p), recursive=True)})
    if not files:
        print(f"FAIL: no YAML files under {root}")
        return 1
    failures = 0
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                list(yaml.load_all(fh, Loader=StrictLoader))
            print(f"ok: {os.path.relpath(f, root)}")
        except yaml.YAMLError as e:
            print(f"FAIL: {os.path.relpath(f, root)}: {e}")
            failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
