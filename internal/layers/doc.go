// Package layers holds no code: its test reads `go list` and fails on an
// import that points up the layers (docs/code-layout.md, "Which package
// may import which"), and on a type of the module's code with more than
// 30 methods (methods_test.go).
package layers
