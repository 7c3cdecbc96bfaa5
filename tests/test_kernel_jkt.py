"""jupyter_kernel_test conformance for both kernelspecs: every feature the kernel supports is
declared, so a regression in any of them fails here (an undeclared one would be skipped)."""
from __future__ import annotations

import unittest

import jupyter_kernel_test as jkt

from kernel_helpers import ensure_kernelspecs


class _ZerobootConformance(jkt.KernelTests):
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "import itertoo", "matches": {"itertools"}},
        {"text": "print(abs", "matches": {"abs"}},
    ]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n", "%sandbox stats"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2", "for i in range(3):"]
    invalid_code_samples = ["import = 7q", "(1, 2]"]
    code_page_something = "print?"
    code_generate_error = "raise"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"},
        {"code": "import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.show()", "mime": "image/png"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    @classmethod
    def setUpClass(cls) -> None:
        ensure_kernelspecs()
        super().setUpClass()

    def test_kernel_info_is_honest(self) -> None:
        self.flush_channels()
        self.kc.kernel_info()
        reply = self.kc.get_shell_msg(timeout=jkt.TIMEOUT)["content"]
        self.assertEqual(reply["implementation"], "zeroboot")
        self.assertEqual(reply["supported_features"], [])
        info = reply["language_info"]
        for key in ("name", "version", "mimetype", "file_extension", "pygments_lexer", "codemirror_mode",
                    "nbconvert_exporter"):
            self.assertIn(key, info)
        self.assertTrue(reply["banner"])
        self.assertTrue(reply["help_links"])


class ZerobootKernelTests(_ZerobootConformance):
    kernel_name = "zeroboot"


class ZerobootIsolatedKernelTests(_ZerobootConformance):
    # Everything above is stateless, so all of it applies to isolated cells too.
    kernel_name = "zeroboot-isolated"


del _ZerobootConformance  # only the concrete kernels are test cases

if __name__ == "__main__":
    unittest.main()
