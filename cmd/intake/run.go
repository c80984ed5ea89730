package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/config"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/spool"
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "config file (YAML)")
	once := fs.Bool("once", false, "poll every partner once, then exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := newLogger(stderr)
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, "intake run:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	url, err := cfg.DatabaseURL()
	if err != nil {
		fmt.Fprintln(stderr, "intake run:", err)
		return 2
	}
	if _, err := migrations.Up(url); err != nil {
		fmt.Fprintln(stderr, "intake run:", err)
		return 1
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(stderr, "intake run: database:", err)
		return 1
	}
	defer pool.Close()
	sp, err := spool.New(cfg.Spool.Dir)
	if err != nil {
		fmt.Fprintln(stderr, "intake run:", err)
		return 1
	}
	d, err := intake.New(cfg.Intake(), cfg.Partners, pool, sp, prometheus.NewRegistry(), log)
	if err != nil {
		fmt.Fprintln(stderr, "intake run:", err)
		return 2
	}
	if err := d.CheckTargets(ctx); err != nil {
		fmt.Fprintln(stderr, "intake run:", err)
		return 1
	}
	if *once {
		code := 0
		for _, p := range cfg.Partners {
			if err := d.PollOnce(ctx, p.ID); err != nil {
				log.Error("poll failed", "partner", p.ID, "err", err)
				code = 1
			}
		}
		return code
	}
	if err := d.Start(ctx); err != nil {
		fmt.Fprintln(stderr, "intake run:", err)
		return 1
	}
	<-ctx.Done()
	log.Info("signal received: draining")
	stop()
	d.Stop()
	return 0
}

func cmdMigrate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "config file (YAML); only database is read")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	url := os.Getenv(config.DefaultDatabaseURLEnv)
	if *path != "" {
		cfg, err := config.Load(*path)
		if err != nil {
			fmt.Fprintln(stderr, "intake migrate:", err)
			return 2
		}
		if url, err = cfg.DatabaseURL(); err != nil {
			fmt.Fprintln(stderr, "intake migrate:", err)
			return 2
		}
	}
	if url == "" {
		fmt.Fprintf(stderr, "intake migrate: give --config or set %s\n", config.DefaultDatabaseURLEnv)
		return 2
	}
	v, err := migrations.Up(url)
	if err != nil {
		fmt.Fprintln(stderr, "intake migrate:", err)
		return 1
	}
	fmt.Fprintf(stdout, "schema at version %d\n", v)
	return 0
}
