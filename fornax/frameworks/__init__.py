"""Front ends: real PyTorch and JAX programs going down fornax's seams.

``fornax.frameworks.torch`` makes ``torch.device("fornax")`` real and adds the
``torch.compile(backend="fornax")`` / ``torch.export`` graph path.
"""
