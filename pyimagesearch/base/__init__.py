"""The ground floor: what every other part of the package stands on, and nothing of it.

- `errors`: the exceptions a script turns into one line and an exit status;
- `files`: paths and JSON files through tf.io.gfile (a local folder or a bucket);
- `publish`: outputs written to their folder all together or not at all;
- `signals`: Ctrl-C and SIGTERM held back for the steps that must not be cut;
- `network`: whether a host answers (tfds' for `auto`, pip's index for the notebook);
- `terminal`: what reaches the terminal: TensorFlow's native log lines, closed streams.

Nothing here imports another part of the package; `errors`, `signals`,
`network` and `terminal` import no TensorFlow either.
"""
