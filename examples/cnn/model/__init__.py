"""The CNN example's models (SINGA's examples/cnn/model): cnn, alexnet, resnet, xceptionnet."""
