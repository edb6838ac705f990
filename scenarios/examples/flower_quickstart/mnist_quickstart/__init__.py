"""mnist_quickstart: A Flower / PyTorch app on MNIST."""
