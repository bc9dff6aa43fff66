from protos import generate


def test_generated_code_matches_ledger_proto():
    assert generate.stale_files() == [], "run: python -m protos.generate"
