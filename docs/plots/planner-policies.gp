# SLO attainment and GPU-hours of static-best, interval and tandem (the
# planner) on each input: render.sh writes dat as
#   "label" att_static att_interval att_tandem gpuh_static gpuh_interval gpuh_tandem
load "docs/plots/common.gp"
set label 99 footnote("engines are tandem-sim's model (docs/planner.md), not GPU measurements") at screen 0.99,0.02 right font ",8" tc rgb "#555555"
set bmargin 6.5
set multiplot layout 1,2 title "tandem-sim, 64 GPUs: the planner against the best static split and a throughput-interval planner" font ",12"
set style data histograms
set style histogram clustered gap 1
set boxwidth 1
set key top left vertical samplen 1.5
set xrange [-0.55:1.55]
set xtics font ",9"
# Bars of a 3-bar cluster with gap 1 sit at -0.25, 0, +0.25 around the cluster.
set title "SLO attainment (TTFT ≤ 4 s and TPOT ≤ 50 ms)"
set yrange [0:1.4]
set ytics 0,0.2,1
plot dat using 2:xtic(1) lc rgb c_static title "static-best (hindsight sweep)", \
     '' using 3 lc rgb c_interval title "interval", \
     '' using 4 lc rgb c_tandem title "tandem (planner)", \
     '' using ($0-0.25):2:(sprintf("%.3f",$2)) with labels offset 0,0.6 font ",8" notitle, \
     '' using ($0):3:(sprintf("%.3f",$3)) with labels offset 0,0.6 font ",8" notitle, \
     '' using ($0+0.25):4:(sprintf("%.3f",$4)) with labels offset 0,0.6 font ",8" notitle
unset label 99
unset key
set title "GPU-hours"
set yrange [0:*]
set ytics autofreq
set offsets 0,0,graph 0.12,0
plot dat using 5:xtic(1) lc rgb c_static title "static-best", \
     '' using 6 lc rgb c_interval title "interval", \
     '' using 7 lc rgb c_tandem title "tandem (planner)", \
     '' using ($0-0.25):5:(sprintf("%.1f",$5)) with labels offset 0,0.6 font ",8" notitle, \
     '' using ($0):6:(sprintf("%.1f",$6)) with labels offset 0,0.6 font ",8" notitle, \
     '' using ($0+0.25):7:(sprintf("%.1f",$7)) with labels offset 0,0.6 font ",8" notitle
unset multiplot
set output
