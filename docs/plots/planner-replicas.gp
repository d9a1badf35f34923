# The planner's (tandem) and interval's replicas per role on the Azure code
# trace x12, 64 GPUs, from tandem-sim --log. render.sh writes, in dir:
#   <policy>.replicas  minute, prefill after the decision, decode after, demand (k uncached tokens/s)
#   <policy>.attain    minute at the interval's end, SLO attainment of the requests that arrived in it
load "docs/plots/common.gp"
set terminal pngcairo size 960,760 font "DejaVu Sans,10" noenhanced
set output out
set multiplot layout 3,1 title "tandem-sim, Azure code trace ×12 (105,828 requests in an hour), 64 GPUs: replicas each 30 s interval" font ",12"
set xrange [0:60]
unset key
set ylabel "replicas (target)"
set y2label "k uncached tokens/s (peak 5 s)"
set y2tics nomirror
set yrange [0:66]
set y2range [0:*]
set boxwidth 0.5
set lmargin 10
set rmargin 10
set title "tandem (the planner): prefill blue, decode green; grey: the prefill demand it saw (right axis)"
plot dir."/tandem.replicas" using 1:4 axes x1y2 with boxes lc rgb c_demand title "prefill demand it saw,\nk uncached tokens/s\n(peak 5 s; right axis)", \
     '' using 1:2 with steps lw 2 lc rgb c_prefill title "prefill", \
     '' using 1:3 with steps lw 2 lc rgb c_decode title "decode"
set title "interval (last interval's demand ÷ profiled throughput): prefill blue, decode green; grey: its demand"
plot dir."/interval.replicas" using 1:4 axes x1y2 with boxes lc rgb c_demand title "prefill demand it saw,\nk uncached tokens/s\n(peak 5 s; right axis)", \
     '' using 1:2 with steps lw 2 lc rgb c_prefill title "prefill", \
     '' using 1:3 with steps lw 2 lc rgb c_decode title "decode"
set title "SLO attainment of the requests that arrived in each interval"
unset y2tics
unset y2label
set ylabel "attainment"
set key at graph 0.99,0.6 right opaque box lc rgb "#cccccc" samplen 1
set yrange [0:1.1]
set xlabel "minutes"
set label 99 footnote("engines are tandem-sim's model (docs/planner.md), not GPU measurements") at screen 0.99,0.012 right font ",8" tc rgb "#555555"
set bmargin 4
plot dir."/tandem.attain" using 1:2 with points pt 7 ps 0.6 lc rgb c_tandem title "tandem (planner)", \
     dir."/interval.attain" using 1:2 with points pt 5 ps 0.5 lc rgb c_interval title "interval"
unset multiplot
set output
