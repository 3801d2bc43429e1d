"""Where the digits come from and how a split is read, beneath `pyimagesearch.data`.

- `sources`: a Source per kind (tfds, the 5,000-digit sample, TFRecords),
  resolved once per run by `resolve_source`, with the network probe of `auto`;
- `pipeline`: `Reading` and the tf.data pipelines, in memory and from
  TFRecords, with each replica's slice of every global batch;
- `tfrecords`: the TFRecord format: describe, verify and read shards;
- `tfrecord_writer`: write a TFRecord folder (tools/write_tfrecords.py), all or nothing;
- `passes`: seeded passes, so every iterator and every worker reads alike.

Nothing here imports `pyimagesearch.data`, the command line or the scripts.
"""
