"""Arguments a command line must carry to the workload unchanged, through every shell and quoting
layer between the controller and the node: quotes, expansions, options, newlines, non-ASCII."""

NASTY = ["plain", "", " leading and trailing ", "it's", 'say "hi"', "$(touch /tmp/pwned)", "`id`", "$HOME",
         "a;b|c&d>e<f", "*", "~", "back\\slash", "new\nline", "tab\there", "-n", "--", "ünïcødé ✓ 漢字",
         "'; rm -rf / #", "!!", "{a,b}", "%s%n"]
