#!/usr/bin/env python3
"""Function sizes in crates/*/src (code before the first inline test module),
from the `fn` line to its closing brace. Prints the count of functions and
of those over 100, 150 and 200 lines; with `v`, lists those over 150.

    python3 scripts/fn-sizes.py [v]
"""
import re,sys,glob,os
res=[]
for f in glob.glob('crates/*/src/**/*.rs',recursive=True):
    lines=open(f).read().split('\n')
    # skip test modules roughly: stop counting at an inline '#[cfg(test)]'
    # module at column 0 (a `#[cfg(test)] mod x;` declaration goes on)
    i=0
    n=len(lines)
    while i<n:
        l=lines[i]
        if l.startswith('#[cfg(test)]') and i+1<n and '{' in lines[i+1]: break
        m=re.match(r'\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)',l)
        if m:
            # find opening brace
            j=i;depth=0;started=False
            while j<n:
                s=re.sub(r'"(\\.|[^"\\])*"','""',lines[j])
                s=re.sub(r"'(\\.|[^'\\])'","''",s)
                s=s.split('//')[0]
                for ch in s:
                    if ch=='{': depth+=1;started=True
                    elif ch=='}': depth-=1
                if not started and s.rstrip().endswith(';'): break
                if started and depth<=0: break
                j+=1
            if started:
                res.append((j-i+1,f,i+1,m.group(6)))
            i=i+1
            continue
        i+=1
res.sort(reverse=True)
over100=[r for r in res if r[0]>100]; over150=[r for r in res if r[0]>150]
print('fns',len(res),'over100',len(over100),'over150',len(over150),'over200',len([r for r in res if r[0]>200]))
if len(sys.argv)>1:
    for r in over150: print(*r)
