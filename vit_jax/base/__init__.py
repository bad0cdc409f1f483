"""Plain helpers that know nothing of models: files and directories written whole or not
at all, TensorFlow imported quietly, terminal output, short lists in messages."""
