"""Synthetic-data Keras training (roles/training_workloads): every visible GPU through MirroredStrategy."""
import os

import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
print("GPUs:", tf.config.list_physical_devices("GPU"), "replicas:", strategy.num_replicas_in_sync, flush=True)
images = tf.random.uniform((8192, 28, 28, 1))
labels = tf.random.uniform((8192,), maxval=10, dtype=tf.int32)
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(images, labels, batch_size=256 * strategy.num_replicas_in_sync, epochs=int(os.environ.get("EPOCHS", "1")))
