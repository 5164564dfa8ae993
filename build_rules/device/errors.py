"""The device tasks' error: a phone, adb or the runtime is not as a device task needs."""


class DeviceError(Exception):
    """The message names the phone (name and serial), the file or the command, and says the fix."""
