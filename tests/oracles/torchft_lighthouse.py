#!/usr/bin/env python3
"""TorchFT's lighthouse: the pinned torchft wheel's own server (the Rust lighthouse_main that its torchft_lighthouse
script calls), loaded without the torchft package. The package's __init__ imports torch, which the server never uses:
1.4 s of every start on an idle 2-core machine, several seconds beside other tests.
  torchft_lighthouse.py --bind 127.0.0.1:0 [torchft_lighthouse's flags]
"""
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig

package = importlib.util.find_spec("torchft")  # where the package is; its __init__ does not run
path = os.path.join(os.path.dirname(package.origin), "_torchft" + sysconfig.get_config_var("EXT_SUFFIX"))
loader = importlib.machinery.ExtensionFileLoader("torchft._torchft", path)
extension = importlib.util.module_from_spec(importlib.util.spec_from_loader("torchft._torchft", loader))
loader.exec_module(extension)
sys.argv[0] = "torchft_lighthouse"
sys.exit(extension.lighthouse_main())
