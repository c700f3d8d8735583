"""The plain test runner of the Python self-tests: runs each test, prints
`ok`/`FAIL` per test and the closing `N passed, N failed` line CI reads."""

import traceback


def run(tests):
    passed = failed = 0
    for t in tests:
        try:
            t()
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {t.__name__}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
