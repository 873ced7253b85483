set -uo pipefail
BIN=.final/moss; E=/tmp/te; O=$OUT
(python3 bench/encoder_gpu.py make $E 2>&1 | grep -v Warning | tail -1) &
MK=$!
timeout 200 $BIN check --device cuda --model golden/tiny-a > $O/check.txt 2>&1; echo "check rc=$?"
grep -E "kernel gates:|FAIL|ACCEPTED|^check" $O/check.txt
wait $MK
for i in 1 2; do
timeout 90 $BIN bench-encode --model $E --ids-file $E/ids128.txt --ids-file $E/ids4096.txt --device cuda --reps 7 > $O/enc$i.jsonl 2>$O/enc$i.err; echo "bench-encode rc=$?"
python3 -c "
import json,sys
for l in open('$O/enc$i.jsonl'):
    if l.startswith('{'):
        j=json.loads(l); p=j.get('profile_ms',{})
        print('L', j['tokens'], 'median', round(j['median_ms'],2), 'device', round(j['device_median_ms'],2), {k: round(v['ms'],2) for k,v in p.items() if k in ('gated_delta_rule','gdn_gates','gated_rms_norm','linear')})"
done
