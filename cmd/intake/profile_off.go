//go:build !cpuprofile

package main

// startCPUProfile without the cpuprofile tag: no profile, and
// INTAKE_CPUPROFILE is not read (see profile_on.go).
func startCPUProfile() (func(), error) { return func() {}, nil }
