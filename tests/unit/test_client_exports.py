"""connector/client/__init__.py exports its names lazily (PEP 562): every name it lists resolves to the object its
module defines, `import *` takes them all, and a name it does not export is an AttributeError as usual."""
import ast
import importlib
import pathlib

import pytest

import connector.client as client


@pytest.mark.parametrize("name", client.__all__)
def test_every_exported_name_is_its_module_s_object(name):
    module = importlib.import_module(f"connector.client.{client._EXPORTS[name]}")
    assert getattr(client, name) is getattr(module, name)
    assert name in dir(client)


def test_import_star_takes_every_exported_name():
    namespace: dict = {}
    exec("from connector.client import *", namespace)
    assert set(client.__all__) <= set(namespace)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        client.NoSuchThing
    assert not hasattr(client, "NoSuchThing")


def test_every_exported_name_is_listed_once():
    assert sorted(client.__all__) == sorted(client._EXPORTS) == sorted(set(client.__all__))


def test_the_names_type_checkers_see_are_the_exported_ones():
    """The TYPE_CHECKING imports (what type checkers see) and _EXPORTS (what runs) name the same things."""
    tree = ast.parse(pathlib.Path(client.__file__).read_text())
    block = next(node for node in tree.body
                 if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    seen = {alias.name: node.module.removeprefix("connector.client.")
            for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert seen == client._EXPORTS
