"""The fuzz harness of issue 19: malformed ONNX files and structures, target YAML, artifacts
and run-time inputs, each case in a long-lived worker subprocess so that a segfault or a hang
is caught and attributed (docs/reliability.md, "Fuzzing")."""
