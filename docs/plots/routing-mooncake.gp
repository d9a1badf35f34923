# tandem-replay's routing policies on the Mooncake synthetic trace, 8
# workers holding half its unique blocks. render.sh writes dat as one row
# per policy: policy hit_ratio hit_bound p99_wait_s direct_share min_session_direct_share
load "docs/plots/common.gp"
set terminal pngcairo size 960,420 font "DejaVu Sans,10" noenhanced
set output out
set multiplot layout 1,2 title "tandem-replay, Mooncake synthetic trace (3,993 requests), 8 workers, half the working set" font ",12"
set style data histograms
set style histogram clustered gap 1
set boxwidth 0.8 relative
unset key
set bmargin 4
set label 99 footnote("simulated workers in simulated time (docs/routing.md, \"Replay\")") at screen 0.99,0.02 right font ",8" tc rgb "#555555"
set title "prefix-cache hit ratio (dashed: the bound, unlimited cache)"
set yrange [0:1]
set xrange [-0.6:3.6]
plot dat using 2:xtic(1) lc rgb c_tandem, \
     '' using 0:2:(sprintf("%.3f",$2)) with labels offset 0,0.7 font ",8", \
     '' using 0:3 with lines dt 2 lc rgb "#333333"
unset label 99
set title "p99 wait before prefill starts (s)"
set yrange [0:*]
set offsets 0,0,graph 0.1,0
plot dat using 4:xtic(1) lc rgb c_ll, \
     '' using 0:4:(sprintf("%.2f",$4)) with labels offset 0,0.7 font ",8"
unset multiplot
set output
