"""Seeded passes over a split: every iterator, and every worker, reads the same sequence.

A leaf module, shared by the in-memory pipeline (`data`) and the TFRecord
reader (`tfrecords`).
"""
import tensorflow as tf


def seeded_passes(one_pass, seed, repeat):
    """Pass k over a split is `one_pass(k)`: every iterator sees the same passes.

    A seeded `shuffle(reshuffle_each_iteration=True)` gives every new
    iterator a new order, and Keras opens one to build the model before
    training, so `fit` and the custom loop would start from different
    orders. Here each pass shuffles with its own seed, derived from `seed`
    and k: every process of a cluster reads the same global batches.

    TensorFlow combines an op's seed with the graph's, and cannot when the
    graph seed is 0 (or 2**31 - 1, the same after its truncation) and the
    op seed is a tensor, as k is: it compares the pair with (0, 0) as a
    Python bool. So each pass sets its graph's seed to `seed` itself (what
    keras.utils.set_random_seed gives it anyway), and to 2**31 where
    TensorFlow would truncate that to 0.

    Upstream: none filed (related: tensorflow/tensorflow#17284). Still
    needed in TensorFlow 2.19.1 and 2.21.0 (tests/test_workarounds.py).
    """
    graph_seed = seed if seed % (2**31 - 1) else 2**31

    def seeded(k):
        if not tf.executing_eagerly():  # tf.data's debug mode runs this eagerly
            tf.compat.v1.get_default_graph().seed = graph_seed  # this pass's graph only
        return one_pass(k)

    passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    return passes.flat_map(seeded)
