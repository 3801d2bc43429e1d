"""The article's convolutional autoencoder for 28x28 grey digits (3,217 weights)."""
import keras
from keras import layers

from pyimagesearch.config import IMAGE_SHAPE


@keras.saving.register_keras_serializable(package="pyimagesearch")
class AutoEncoder(keras.Model):
    """Two strided convolutions down to 7x7x8, two transposed ones back up."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # encoder: 28x28x1 -> 14x14x16 -> 7x7x8 (the bottleneck)
        self.encoder = keras.Sequential([
            keras.Input(IMAGE_SHAPE),
            layers.Conv2D(16, 3, strides=2, activation="relu", padding="same"),
            layers.Conv2D(8, 3, strides=2, activation="relu", padding="same"),
        ], name="encoder")
        # decoder: 7x7x8 -> 14x14x8 -> 28x28x16 -> 28x28x1 in [0, 1]
        self.decoder = keras.Sequential([
            keras.Input((7, 7, 8)),
            layers.Conv2DTranspose(8, 3, strides=2, activation="relu",
                                   padding="same"),
            layers.Conv2DTranspose(16, 3, strides=2, activation="relu",
                                   padding="same"),
            # float32 under mixed precision too: the output and the loss
            # keep full precision (a no-op under the default float32)
            layers.Conv2D(1, 3, activation="sigmoid", padding="same", dtype="float32"),
        ], name="decoder")

    def call(self, x):
        return self.decoder(self.encoder(x))
