# Shared by the plots of render.sh: the terminal and the colours.
# Input variables (gnuplot -e): out (the PNG), commit (the footnote's commit).
set encoding utf8
set terminal pngcairo size 960,520 font "DejaVu Sans,10" noenhanced
set output out
# One colour per policy, the same in every plot.
c_static = "#7f7f7f"; c_interval = "#d62728"; c_tandem = "#1f77b4"
c_rr = "#9467bd"; c_ll = "#8c564b"; c_ca = "#ff7f0e"
c_prefill = "#1f77b4"; c_decode = "#2ca02c"; c_demand = "#d9d9d9"
set style fill solid 0.85 noborder
set grid ytics lc rgb "#e5e5e5" lt 1
set border 3
set tics nomirror
# The footnote: what the numbers are and where they come from (drawn by the
# first plot of a multiplot; each file unsets it after that plot).
footnote(what) = sprintf("%s · rendered by ./tandem plots (docs/plots/render.sh) at commit %s", what, commit)
