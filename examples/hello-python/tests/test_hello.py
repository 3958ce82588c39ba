from hello import greet, newest


def test_greet():
    assert greet("belay") == "hello, belay"


def test_newest_uses_real_version_ordering():
    assert newest("1.9", "1.10", "1.2") == "1.10"
