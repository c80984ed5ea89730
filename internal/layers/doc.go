// Package layers holds no code: its test reads `go list` and fails on an
// import that points up the layers (docs/code-layout.md, "Which package
// may import which").
package layers
