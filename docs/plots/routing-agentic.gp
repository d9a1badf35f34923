# tandem-replay's routing policies on 52 agentic sessions (DualPath 32K),
# 8 D of 256 blocks and 7 D of 195 blocks. render.sh writes agentic8.dat and
# agentic7.dat in dir, one row per policy:
#   policy hit_ratio hit_bound p99_wait_s direct_share min_session_direct_share
load "docs/plots/common.gp"
set terminal pngcairo size 960,700 font "DejaVu Sans,10" noenhanced
set output out
set multiplot layout 2,2 title "tandem-replay, 52 agentic sessions (1,924 requests, 32K shape): 8 D of 131K tokens, 7 D of 100K tokens" font ",12"
set style data histograms
set style histogram clustered gap 1
set boxwidth 1
set xrange [-0.6:3.6]
set bmargin 4
set label 99 footnote("simulated workers in simulated time (docs/routing.md, \"Replay\")") at screen 0.99,0.015 right font ",8" tc rgb "#555555"
set key top left samplen 1.5
# Bars of a 2-bar cluster with gap 1 sit at -1/6 and +1/6 around the cluster.
set title "share of turns ≥ 1 served direct-to-D"
set yrange [0:1.15]
set ytics 0,0.2,1
plot dir."/agentic8.dat" using 5:xtic(1) lc rgb c_tandem title "8 D", \
     dir."/agentic7.dat" using 5 lc rgb c_ca title "7 D", \
     dir."/agentic8.dat" using ($0-1/6.):5:(sprintf("%.2f",$5)) with labels offset 0,0.6 font ",8" notitle, \
     dir."/agentic7.dat" using ($0+1/6.):5:(sprintf("%.2f",$5)) with labels offset 0,0.6 font ",8" notitle
unset key
unset label 99
set title "the worst session's direct-to-D share"
plot dir."/agentic8.dat" using 6:xtic(1) lc rgb c_tandem, \
     dir."/agentic7.dat" using 6 lc rgb c_ca, \
     dir."/agentic8.dat" using ($0-1/6.):6:(sprintf("%.2f",$6)) with labels offset 0,0.6 font ",8", \
     dir."/agentic7.dat" using ($0+1/6.):6:(sprintf("%.2f",$6)) with labels offset 0,0.6 font ",8"
set title "prefix-cache hit ratio (dashed: the bound)"
plot dir."/agentic8.dat" using 2:xtic(1) lc rgb c_tandem, \
     dir."/agentic7.dat" using 2 lc rgb c_ca, \
     dir."/agentic8.dat" using ($0-1/6.):2:(sprintf("%.2f",$2)) with labels offset 0,0.6 font ",8", \
     dir."/agentic7.dat" using ($0+1/6.):2:(sprintf("%.2f",$2)) with labels offset 0,0.6 font ",8", \
     dir."/agentic8.dat" using 0:3 with lines dt 2 lc rgb "#333333"
set title "p99 wait before prefill starts (s, log scale)"
set logscale y
set yrange [0.005:300]
set ytics ("0.01" 0.01, "0.1" 0.1, "1" 1, "10" 10, "100" 100)
plot dir."/agentic8.dat" using 4:xtic(1) lc rgb c_tandem, \
     dir."/agentic7.dat" using 4 lc rgb c_ca, \
     dir."/agentic8.dat" using ($0-1/6.):4:(sprintf("%.2f",$4)) with labels offset 0,0.6 font ",8", \
     dir."/agentic7.dat" using ($0+1/6.):4:(sprintf("%.2f",$4)) with labels offset 0,0.6 font ",8"
unset multiplot
set output
