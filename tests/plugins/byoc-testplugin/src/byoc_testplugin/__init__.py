"""byoc test plugin: the ``testchip`` target (see :mod:`byoc_testplugin.plugin`)."""

__version__ = "0.1.0"
