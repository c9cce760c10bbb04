// Command dashboard-png draws the panels of ironlb's Grafana dashboard
// (charts/ironlb/dashboards/ironlb.json) as one PNG, from Prometheus range
// queries captured in the lab (TestPrometheus with E2E_DASHBOARD_CAPTURE). Grafana
// itself is not installable on the project's machines, so docs/observability.md
// shows the panels this way: the same queries, the same legends.
//
//	go run . -capture /tmp/ironlb-dash.json -dashboard ../../charts/ironlb/dashboards/ironlb.json -out ../../docs/images/dashboard.png
//
// It is its own module (like hack/image) so that the plotting library stays out
// of ironlb's go.mod.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"log"
	"os"
	"regexp"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			RefID        string `json:"refId"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
		FieldConfig struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
	} `json:"panels"`
}

type capture struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	// Events are what the test injected, drawn as numbered vertical lines.
	Events []struct {
		At   int64  `json:"at"`
		What string `json:"what"`
	} `json:"events"`
	Queries []struct {
		Panel  string `json:"panel"`
		RefID  string `json:"refId"`
		Result []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		} `json:"result"`
	} `json:"queries"`
}

func main() {
	capturePath := flag.String("capture", "", "range queries captured by TestPrometheus (E2E_DASHBOARD_CAPTURE)")
	dashPath := flag.String("dashboard", "../../charts/ironlb/dashboards/ironlb.json", "the dashboard JSON")
	out := flag.String("out", "dashboard.png", "PNG to write")
	flag.Parse()
	if err := run(*capturePath, *dashPath, *out); err != nil {
		log.Fatal(err)
	}
}

func run(capturePath, dashPath, out string) error {
	var d dashboard
	var c capture
	if err := readJSON(dashPath, &d); err != nil {
		return err
	}
	if err := readJSON(capturePath, &c); err != nil {
		return err
	}
	const cols = 2
	rows := (len(d.Panels) + 1 + cols - 1) / cols // one more tile: the events
	w, h := 12*vg.Inch, vg.Length(rows)*2.6*vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(72), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 3, PadY: vg.Millimeter * 3,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	for i, p := range d.Panels {
		pl := plot.New()
		pl.Title.Text = p.Title
		pl.Title.TextStyle.Font.Size = font.Length(11)
		pl.X.Label.Text = "seconds since the test started"
		if p.FieldConfig.Defaults.Unit != "" {
			pl.Y.Label.Text = p.FieldConfig.Defaults.Unit
		}
		pl.Legend.Top = true
		pl.Legend.TextStyle.Font.Size = font.Length(7)
		pl.Add(plotter.NewGrid())
		n := 0
		var ipRows []string // state timeline: one row per IP
		var nodes []string  // state timeline: one colour per node
		for _, t := range p.Targets {
			for _, q := range c.Queries {
				if q.Panel != p.Title || q.RefID != t.RefID {
					continue
				}
				res := q.Result
				sort.Slice(res, func(a, b int) bool {
					return legend(t.LegendFormat, res[a].Metric) < legend(t.LegendFormat, res[b].Metric)
				})
				for _, s := range res {
					pts, err := points(s.Values, c.Start)
					if err != nil {
						return fmt.Errorf("panel %q: %w", p.Title, err)
					}
					colour, name, width := n, legend(t.LegendFormat, s.Metric), vg.Points(1.5)
					newNode := true
					if p.Type == "state-timeline" {
						// One row per IP, one colour per announcing node.
						row := indexOf(&ipRows, s.Metric["ip"])
						for j := range pts {
							pts[j].Y = float64(row)
						}
						known := len(nodes)
						colour, name, width = indexOf(&nodes, s.Metric["node"]), s.Metric["node"], vg.Points(8)
						newNode = len(nodes) > known
					}
					for k, seg := range segments(pts) {
						l, err := plotter.NewLine(seg)
						if err != nil {
							return err
						}
						l.Color = palette(colour)
						l.Width = width
						pl.Add(l)
						if k == 0 && newNode {
							pl.Legend.Add(name, l)
						}
					}
					n++
				}
			}
		}
		if p.Type == "state-timeline" {
			var ticks []plot.Tick
			for r, ip := range ipRows {
				ticks = append(ticks, plot.Tick{Value: float64(r), Label: ip})
			}
			pl.Y.Tick.Marker = plot.ConstantTicks(ticks)
			pl.Y.Min, pl.Y.Max = -0.8, float64(len(ipRows))+2.5 // room for the legend
			pl.Y.Label.Text = ""
		}
		pl.X.Min, pl.X.Max = 0, float64(c.End-c.Start) // one time axis for every panel
		if err := addEvents(pl, c); err != nil {
			return err
		}
		pl.Draw(tiles.At(dc, i%cols, i/cols))
	}
	drawEventList(tiles.At(dc, len(d.Panels)%cols, len(d.Panels)/cols), c)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// addEvents draws the injected events as numbered dashed vertical lines.
func addEvents(pl *plot.Plot, c capture) error {
	lo, hi := pl.Y.Min, pl.Y.Max
	for i, ev := range c.Events {
		x := float64(ev.At - c.Start)
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: lo}, {X: x, Y: hi}})
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 120}
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: hi}}, Labels: []string{strconv.Itoa(i + 1)}})
		if err != nil {
			return err
		}
		lb.TextStyle[0].Font.Size = font.Length(8)
		pl.Add(l, lb)
	}
	return nil
}

// drawEventList writes what each numbered line is.
func drawEventList(dc draw.Canvas, c capture) {
	sty := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 11), Handler: plot.DefaultTextHandler}
	y := dc.Max.Y - vg.Points(20)
	dc.FillText(sty, vg.Point{X: dc.Min.X + vg.Points(30), Y: y}, "Injected in the lab (dashed lines):")
	for i, ev := range c.Events {
		y -= vg.Points(16)
		dc.FillText(sty, vg.Point{X: dc.Min.X + vg.Points(40), Y: y}, fmt.Sprintf("%d  at %3d s: %s", i+1, ev.At-c.Start, ev.What))
	}
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// points converts Prometheus [unix time, "value"] pairs to seconds since start.
func points(values [][2]any, start int64) (plotter.XYs, error) {
	var pts plotter.XYs
	for _, v := range values {
		ts, ok := v[0].(float64)
		s, ok2 := v[1].(string)
		if !ok || !ok2 {
			return nil, fmt.Errorf("unexpected sample %v", v)
		}
		y, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, err
		}
		pts = append(pts, plotter.XY{X: ts - float64(start), Y: y})
	}
	return pts, nil
}

// segments splits a series where samples are missing (more than two steps apart),
// so a line is not drawn across a gap.
func segments(pts plotter.XYs) []plotter.XYs {
	var out []plotter.XYs
	from := 0
	for i := 1; i <= len(pts); i++ {
		if i == len(pts) || pts[i].X-pts[i-1].X > 5 {
			seg := pts[from:i:i] // capacity i: an append must not overwrite pts[i]
			if len(seg) == 1 {
				// A lone sample: a short dash, so it shows.
				seg = append(seg, plotter.XY{X: seg[0].X + 1, Y: seg[0].Y})
			}
			out = append(out, seg)
			from = i
		}
	}
	return out
}

var legendVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_]+)\s*\}\}`)

// legend expands a Grafana legend format ({{label}}) with a series' labels.
func legend(format string, metric map[string]string) string {
	return legendVar.ReplaceAllStringFunc(format, func(m string) string {
		return metric[legendVar.FindStringSubmatch(m)[1]]
	})
}

func indexOf(list *[]string, s string) int {
	for i, v := range *list {
		if v == s {
			return i
		}
	}
	*list = append(*list, s)
	return len(*list) - 1
}

// palette is Grafana's classic palette.
func palette(i int) color.Color {
	cs := []uint32{0x7EB26D, 0xEAB839, 0x6ED0E0, 0xEF843C, 0xE24D42, 0x1F78C1, 0xBA43A9, 0x705DA0, 0x508642, 0xCCA300}
	c := cs[i%len(cs)]
	return color.RGBA{R: uint8(c >> 16), G: uint8(c >> 8), B: uint8(c), A: 255}
}
