#!/bin/sh
# A scripted builder (no model, deterministic): it reads the prompt on stdin
# and acts on the request the way an agent CLI would with its tools.
p=$(cat)
case "$p" in
  *"title"*)
    sed -i 's#<h1>.*</h1>#<h1>Welcome</h1>#' index.html
    echo "I changed the page title to Welcome."
    printf '===COMMIT-MESSAGE===\nsite: the title says Welcome\n===END-COMMIT-MESSAGE===\n' ;;
  *"footer"*)
    echo '<footer>made with belay</footer>' >> index.html
    echo "I added a footer."
    printf '===COMMIT-MESSAGE===\nsite: a footer\n===END-COMMIT-MESSAGE===\n' ;;
  *)
    echo "I looked at the site; there is nothing to change for this request." ;;
esac
